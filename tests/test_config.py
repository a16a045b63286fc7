"""One set of defaults: the config dataclasses' defaults are the default search's (default.toml)."""

import dataclasses

from ilr_search.config import SpaceConfig
from ilr_search.space import DEFAULT_SPACE, load_space


def test_the_dataclass_defaults_are_the_default_space():
    loaded = load_space(DEFAULT_SPACE)
    assert dataclasses.replace(loaded, source="") == SpaceConfig()


def fixture_config() -> dict:
    """The configuration stored by the study tests/fixtures/study-eeb668a.sql (made before schema versions)."""
    import json
    import sqlite3

    from conftest import ROOT

    with sqlite3.connect(":memory:") as conn:
        conn.executescript((ROOT / "tests" / "fixtures" / "study-eeb668a.sql").read_text(encoding="utf-8"))
        (value,) = conn.execute("select value_json from study_user_attributes where key = 'ilr:config'").fetchone()
    return json.loads(value)


def test_a_space_round_trips_through_to_dict_with_its_schema_version():
    import json

    from conftest import TINY_SPACE

    from ilr_search.config import SPACE_SCHEMA_VERSION
    from ilr_search.space import load_space

    for space in (
        SpaceConfig(),
        load_space(
            TINY_SPACE, {"search": {"knobs": ["injection"], "enqueue": ["2,1,1,1"]}, "model": {"injection": "gated"}}
        ),
    ):
        stored = json.loads(json.dumps(space.to_dict()))  # as a study stores it: JSON, tuples become lists
        assert stored["schema_version"] == SPACE_SCHEMA_VERSION
        assert SpaceConfig.from_dict(stored) == space


def test_an_unversioned_stored_config_reads_as_version_0_with_the_settings_it_ran_with():
    from conftest import ROOT

    from ilr_search.config import ModelConfig
    from ilr_search.search.plan import StoredConfig
    from ilr_search.space import load_space

    stored = fixture_config()
    assert "schema_version" not in stored and "knobs" not in stored["search"] and "target" not in stored["search"]
    config = StoredConfig.from_dict(stored)
    made_from = load_space(ROOT / "tests" / "fixtures" / "space-eeb668a.toml")
    space = config.space
    assert config.schema_version == 0 and config.init_depth == 0 and config.budget.text == "1.5x"
    assert space.data == made_from.data
    # the knobs off (the model of that commit), max_reuse as stored (the model's tables cover the search's)
    assert space.model == ModelConfig(**{**dataclasses.asdict(made_from.model), "max_reuse": 3})
    assert space.search.knobs == () and space.search.max_reuse == made_from.search.max_reuse
    assert (space.search.target, space.search.race_seeds, space.search.race_contenders) == (4.0, 3, 3)
    for name in ("steps", "batch_size", "lr", "eval_fractions", "eval_windows", "seed", "dtype"):
        assert getattr(space.train, name) == getattr(made_from.train, name), name
    without_dtype = stored | {"train": {k: v for k, v in stored["train"].items() if k != "dtype"}}
    assert SpaceConfig.from_dict(without_dtype).train.dtype == "fp32"  # never "auto": a study ran in one dtype


def test_a_newer_schema_version_is_refused():
    import pytest

    from ilr_search.config import SPACE_SCHEMA_VERSION

    with pytest.raises(ValueError, match="schema version"):
        SpaceConfig.from_dict(SpaceConfig().to_dict() | {"schema_version": SPACE_SCHEMA_VERSION + 1})


def test_a_new_study_stores_the_version_and_an_old_one_keeps_its_derived_name():
    from conftest import ROOT

    from ilr_search.config import SPACE_SCHEMA_VERSION
    from ilr_search.search.plan import StoredConfig, config_differences, derive_study_name, plan_study, study_identity
    from ilr_search.space import load_space

    plan = plan_study(load_space(ROOT / "tests" / "fixtures" / "space-eeb668a.toml"), "1.5x", None)
    stored = fixture_config()
    assert plan.config["schema_version"] == SPACE_SCHEMA_VERSION
    # the same space today names the study it named before, and a resume finds nothing changed
    assert derive_study_name(stored) == plan.name
    assert config_differences(study_identity(stored), study_identity(plan.config)) == []
    read = StoredConfig.from_dict(plan.config)
    assert read.schema_version == SPACE_SCHEMA_VERSION and read.space.model == plan.model
    assert read.space.train.dtype == plan.dtype and read.space.search.target == plan.space.search.target


def test_the_architecture_options_are_stored_only_when_set_and_read_back():
    from conftest import TINY_SPACE

    from ilr_search.config import ARCHITECTURE_FIELD_DEFAULTS, ModelConfig
    from ilr_search.search.plan import StoredConfig, plan_study
    from ilr_search.space import load_space

    plain = plan_study(load_space(TINY_SPACE), "1.5x", None)
    assert not set(ARCHITECTURE_FIELD_DEFAULTS) & set(plain.config["model"])
    assert set(ARCHITECTURE_FIELD_DEFAULTS) <= {f.name for f in dataclasses.fields(ModelConfig)}
    options = {"n_kv_heads": 2, "head_dim": 8, "tie_embeddings": False, "qkv_bias": True, "qk_norm": True}
    space = load_space(TINY_SPACE)
    planned = plan_study(dataclasses.replace(space, model=dataclasses.replace(space.model, **options)), "1.5x", None)
    assert {k: planned.config["model"][k] for k in options} == options and planned.name != plain.name
    assert StoredConfig.from_dict(planned.config).space.model == planned.model


def test_the_architecture_options_are_checked():
    import pytest

    from ilr_search.config import ModelConfig

    cfg = ModelConfig(d_model=32, n_heads=4, n_kv_heads=2, head_dim=6)
    assert (cfg.kv_heads, cfg.head_size) == (2, 6) and (ModelConfig().kv_heads, ModelConfig().head_size) == (4, 8)
    assert ModelConfig(d_model=30, n_heads=4, head_dim=8).head_size == 8  # an explicit head size need not divide
    for bad, words in (
        ({"n_kv_heads": 3}, "not divisible by key/value heads"),
        ({"head_dim": 5}, "even head size"),
        ({"n_kv_heads": -1}, "n_kv_heads"),
        ({"d_model": 30}, "not divisible by heads"),
    ):
        with pytest.raises(ValueError, match=words):
            ModelConfig(**{"d_model": 32, "n_heads": 4, **bad})
