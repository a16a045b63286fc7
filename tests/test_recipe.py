"""The winner, to full scale: `recipe` writes a study's map with its settings, `train --from-study --save` trains it
with the study's settings and saves it, and `ILRTransformer.load` gives back a model that evaluates to the same loss."""

import json
import sys

import optuna
import pytest
import torch
from conftest import NO_REFERENCES, assert_one_line_error, write_space

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@pytest.fixture(scope="module")
def small_study(tmp_path_factory, token_cache):
    """A real 4-trial study of the tiny space (no references: the recipe reads only trials)."""
    from ilr_search.search.run import RunRequest, run_in_process
    from ilr_search.space import load_space

    root = tmp_path_factory.mktemp("recipe")
    space = load_space(write_space(root / "space.toml", search=NO_REFERENCES))
    url = f"sqlite:///{root / 'r.db'}"
    summary = run_in_process(
        RunRequest(space, "2x", "rec", url, n_trials=4, pruner="none", checkpoint_dir=root / "ck")
    ).to_json()
    return root, url, summary


@pytest.mark.slow
def test_recipe_names_the_best_front_map_and_the_study_settings(small_study, cli, tmp_path):
    root, url, summary = small_study
    best = min(summary["pareto"], key=lambda p: p["val_ppl"])
    proc = cli("recipe", "--study", "rec", "--storage", url, "--out", str(tmp_path / "r.toml"), check=True)
    assert "lowest perplexity" in proc.stderr and ",".join(map(str, best["reuse_map"])) in proc.stderr
    recipe = tomllib.loads((tmp_path / "r.toml").read_text())
    study = optuna.load_study(study_name="rec", storage=url)
    stored = study.user_attrs["ilr:config"]
    assert recipe["reuse_map"] == best["reuse_map"]
    assert recipe["schedule"] == [i for i, r in enumerate(best["reuse_map"]) for _ in range(r)]
    assert (
        recipe["model"]["n_layers"] == stored["model"]["n_layers"]
        and recipe["model"]["d_model"] == stored["model"]["d_model"]
    )
    assert recipe["data"] == stored["data"]
    assert {k: recipe["train"][k] for k in ("steps", "lr", "batch_size", "seed")} == {
        k: stored["train"][k] for k in ("steps", "lr", "batch_size", "seed")
    }
    assert recipe["measured"]["proxy"]["val_ppl"] == pytest.approx(best["val_ppl"])
    assert recipe["flops_ratio"] == pytest.approx(best["flops_ratio"])

    as_json = json.loads(
        cli("recipe", "--study", "rec", "--storage", url, "--map", recipe["map"], "--json", check=True).stdout
    )
    assert as_json["reuse_map"] == recipe["reuse_map"] and as_json["measured"]["prediction"] is None


@pytest.mark.slow
@pytest.mark.parametrize(
    "args", [["--study", "nope"], ["--map", "9,9"], ["--map", "x"], ["--map", "block7"], ["--out", "r.yaml"]]
)
def test_recipe_bad_input_is_one_error_line(small_study, cli, tmp_path, args):
    _, url, _ = small_study
    if "--study" not in args:
        args = ["--study", "rec", *args]
    proc = cli("recipe", "--storage", url, *args)
    assert_one_line_error(proc)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_map_the_study_did_not_train_has_no_recipe(small_study, cli):
    _, url, _ = small_study
    trained = {
        ",".join(map(str, t.user_attrs["reuse_map"]))
        for t in optuna.load_study(study_name="rec", storage=url).trials
        if t.user_attrs.get("reuse_map")
    }
    untrained = next(m for m in ("1,1,1,2", "1,1,2,1", "1,2,1,1", "2,1,1,1", "1,1,1,3") if m not in trained)
    assert_one_line_error(cli("recipe", "--study", "rec", "--storage", url, "--map", untrained))


@pytest.mark.slow
def test_train_from_study_saves_a_model_that_loads_back_to_the_same_loss(small_study, cli, tmp_path):
    from ilr_search.config import SpaceConfig
    from ilr_search.data.tokens import load_space_tokens
    from ilr_search.training.model import ILRTransformer, read_saved
    from ilr_search.training.train import evaluate

    _, url, _ = small_study
    recipe = json.loads(cli("recipe", "--study", "rec", "--storage", url, "--json", check=True).stdout)
    proc = cli(
        "train",
        "--from-study",
        "rec",
        "--storage",
        url,
        "--map",
        recipe["map"],
        "--steps",
        "12",
        "--save",
        str(tmp_path / "model"),
        "--json",
        check=True,
    )
    report = json.loads(proc.stdout)
    assert report["reuse_map"] == recipe["reuse_map"] and report["steps"] == 12
    assert (tmp_path / "model" / "model.safetensors").exists()

    model, schedule = ILRTransformer.load(tmp_path / "model")
    assert schedule == recipe["schedule"]
    files = read_saved(tmp_path / "model")
    assert files.train.lr == recipe["train"]["lr"] and files.model.d_model == recipe["model"]["d_model"]
    data = load_space_tokens(SpaceConfig(model=files.model, data=files.data, train=files.train))
    val_loss, _, _ = evaluate(model, schedule, data, files.train, torch.device("cpu"), torch.float32)
    assert val_loss == pytest.approx(report["val_loss"], rel=1e-6)


@pytest.mark.slow
def test_train_from_study_refuses_other_settings_before_training(small_study, cli, tmp_path):
    _, url, _ = small_study
    proc = cli("train", "--from-study", "rec", "--storage", url, "--layers", "6", "--save", str(tmp_path / "m"))
    assert_one_line_error(proc)
    assert "--layers" in proc.stderr and not (tmp_path / "m").exists()
    assert_one_line_error(cli("train", "--from-study", "nope", "--storage", url))
    assert_one_line_error(cli("train", "--map", "2,1,1,1"))


@pytest.mark.slow
def test_a_map_with_knobs_trains_saves_and_loads_with_its_knob_parameters(small_study, cli, tmp_path):
    from ilr_search.training.model import ILRTransformer

    _, url, _ = small_study
    report = json.loads(
        cli(
            "train",
            "--from-study",
            "rec",
            "--storage",
            url,
            "--map",
            "2,1,1,1|injection=gated",
            "--steps",
            "4",
            "--save",
            str(tmp_path / "m"),
            "--json",
            check=True,
        ).stdout
    )
    assert report["knobs"] == "injection=gated" and report["map"] == "2,1,1,1|injection=gated"
    model, schedule = ILRTransformer.load(tmp_path / "m")
    assert model.cfg.injection == "gated" and model.injection_gates is not None and schedule == [0, 0, 1, 2, 3]
    assert report["params"] == model.num_params()
