"""mergekit passthrough configs in and out (training/mergekit.py): layer-scan's config of one model reads as its block
map; `run --enqueue FILE.yml` trains the map (and damping) a config stacks; `export-model --format mergekit` writes
the config of a frozen study's map, which mergekit itself builds into the model `export-model --format hf` writes
(and the project's model runs), damped or not; written configs read back as the same map and knobs; bad configs
are one error line and write nothing."""

import dataclasses
import json
import sqlite3
from pathlib import Path

import pytest
import torch
from conftest import ROOT, SHORT_CORPUS, assert_one_line_error, frozen_run_args, run_cli, write_space

transformers = pytest.importorskip("transformers")

N_LAYERS = 6
STUDY = "mk"

# layer-scan's shape (slices [0, J+1] and [I, L] of one model) on 6 layers, the second pass damped by 0.5
DAMPED_BLOCK = """\
merge_method: passthrough
slices:
  - sources:
      - model: {model}
        layer_range: [0, 5]
  - sources:
      - model: {model}
        layer_range: [2, 5]
        parameters:
          scale:
            - filter: o_proj
              value: 0.5
            - filter: down_proj
              value: 0.5
            - value: 1.0
  - sources:
      - model: {model}
        layer_range: [5, 6]
"""

LAYER_SCAN_30 = """\
merge_method: passthrough
slices:
  - sources:
      - model: /path/or/hf-name
        layer_range: [0, 28]
  - sources:
      - model: /path/or/hf-name
        layer_range: [16, 30]
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny 6-layer Llama of random weights (large enough that a damped pass changes the logits), with the byte
    tokenizer."""
    from ilr_search.data.tokenizers import byte_tokenizer_model

    folder = tmp_path_factory.mktemp("mergekit-source") / "tiny-llama"
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        initializer_range=0.1,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    byte_tokenizer_model().save(str(folder / "tokenizer.json"))
    return folder


def frozen_args(space: Path, checkpoint: Path, storage: str, *extra: str) -> list[str]:
    return [
        *frozen_run_args(space, checkpoint, "2x", storage),
        *extra,
    ]


@pytest.fixture(scope="module")
def space(tmp_path_factory) -> Path:
    return write_space(
        tmp_path_factory.mktemp("mergekit-space") / "space.toml",
        search={"noise_seeds": 0, "families": ["ilr", "blocks"], "n_trials": 2, "enqueue_paper_maps": False},
        train={"eval_windows": 8},
        data=SHORT_CORPUS,  # a model of random weights: its tests read maps, configs and logits
    )


@pytest.fixture(scope="module")
def study(tmp_path_factory, token_cache, checkpoint, space):
    """A frozen study of the checkpoint searching damping, with the damped layer-scan-shaped config enqueued."""
    root = tmp_path_factory.mktemp("mergekit-study")
    config = root / "damped.yml"
    config.write_text(DAMPED_BLOCK.format(model=checkpoint), encoding="utf-8")
    url = f"sqlite:///{root / 'study.db'}"
    proc = run_cli(
        frozen_args(space, checkpoint, url, "--knobs", "damping", "--enqueue", str(config), "--study", STUDY, "--json"),
        root,
        {"ILR_SEARCH_CACHE": str(token_cache)},
    )
    assert proc.returncode == 0, proc.stderr
    return url, json.loads(proc.stdout)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_layer_scans_config_reads_as_its_block(tmp_path):
    from ilr_search.training.mergekit import candidate_key, read_passthrough
    from ilr_search.training.schedule import Map

    read = read_passthrough(write(tmp_path / "scan.yml", LAYER_SCAN_30), 30)
    assert read.map == Map.of_block(16, 27, 2, 30) and read.key == "block:16-27:2"
    assert read.damping == 1.0 and read.repeat_scale == "off" and read.model == "/path/or/hf-name"
    assert read.schedule == tuple(range(28)) + tuple(range(16, 30))
    small = LAYER_SCAN_30.replace("[0, 28]", "[0, 5]").replace("[16, 30]", "[2, 6]")
    assert candidate_key(write(tmp_path / "small.yaml", small), N_LAYERS) == "block:2-4:2"
    damped = write(tmp_path / "damped.yml", DAMPED_BLOCK.format(model="m"))
    assert candidate_key(damped, N_LAYERS) == "block:2-4:2|damping=0.5"
    assert candidate_key("block:2-4:2|damping=0.5", N_LAYERS) == "block:2-4:2|damping=0.5"
    assert candidate_key("block:3-3:2", N_LAYERS) == "1,1,1,2,1,1"  # one schedule, one key


def test_an_enqueued_config_is_trained_as_its_map_and_damping(study):
    _, summary = study
    keys = {r["map_key"] for r in summary["race"]["results"] if r["source"] == "trial 0"}
    assert keys == {"block:2-4:2|damping=0.5"}


def merged_logits(config_text: str, out: Path, x: torch.Tensor) -> torch.Tensor:
    """The model mergekit builds from a config (its Python API, on the CPU, offline), run by transformers."""
    import yaml
    from mergekit.config import MergeConfiguration
    from mergekit.merge import run_merge
    from mergekit.options import MergeOptions

    run_merge(
        MergeConfiguration.model_validate(yaml.safe_load(config_text)),
        str(out),
        MergeOptions(copy_tokenizer=True, quiet=True, write_model_card=False),
    )
    return hf_logits(out, x)


def hf_logits(folder: Path, x: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(input_ids=x, use_cache=False).logits


def project_logits(checkpoint: Path, schedule, damping: float, x: torch.Tensor, parts=()) -> torch.Tensor:
    from ilr_search.training.build import build_model
    from ilr_search.training.pretrained import open_checkpoint

    cfg = dataclasses.replace(open_checkpoint(str(checkpoint), seq_len=64).config, damping=damping, parts=parts)
    with torch.no_grad():
        return build_model(cfg, seed=0).eval()(x, list(schedule))


@pytest.mark.parametrize(
    "map_key,damping,ranges",
    [
        ("block:2-4:2|damping=0.5", 0.5, [[0, 5], [2, 5], [5, 6]]),
        ("block:2-4:2", 1.0, [[0, 5], [2, 6]]),  # layer-scan's two slices
        ("2,1,1,3,1,1|damping=0.25", 0.25, [[0, 1], [0, 1], [1, 4], [3, 4], [3, 4], [4, 6]]),
        # one-branch passes: the other branch's projection scaled by 0
        ("1,3a,1,2m,1,1", 1.0, [[0, 1], [1, 2], [1, 2], [1, 4], [3, 4], [4, 6]]),
        ("block:2-4:2a|damping=0.5", 0.5, [[0, 2], [2, 5], [2, 5], [5, 6]]),
    ],
)
def test_mergekit_builds_the_exported_config_into_the_hf_exports_model(
    map_key, damping, ranges, study, checkpoint, cli, tmp_path
):
    pytest.importorskip("mergekit")
    import yaml

    from ilr_search.training.mergekit import read_passthrough

    url, _ = study
    config = tmp_path / "model.yml"
    report = json.loads(
        cli(
            "export-model",
            "--study",
            STUDY,
            "--storage",
            url,
            "--map",
            map_key,
            "--format",
            "mergekit",
            "--out",
            str(config),
            "--json",
            check=True,
        ).stdout
    )
    assert report["format"] == "mergekit" and report["map"] == map_key and report["family"] is None
    text = config.read_text(encoding="utf-8")
    assert text.startswith("# written by ilr-search") and map_key in text.splitlines()[0]
    doc = yaml.safe_load(text)
    assert [s["sources"][0]["layer_range"] for s in doc["slices"]] == ranges
    assert {s["sources"][0]["model"] for s in doc["slices"]} == {str(checkpoint.resolve())}
    read = read_passthrough(config, N_LAYERS)
    assert read.key == map_key and tuple(report["schedule"]) == read.schedule
    cli("export-model", "--study", STUDY, "--storage", url, "--map", map_key, "--out", str(tmp_path / "hf"), check=True)
    x = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    merged = merged_logits(text, tmp_path / "merged", x)
    assert transformers.AutoConfig.from_pretrained(tmp_path / "merged").num_hidden_layers == len(read.schedule)
    assert (merged - hf_logits(tmp_path / "hf", x)).abs().max().item() < 1e-4
    assert (merged - project_logits(checkpoint, read.schedule, damping, x, read.map.parts)).abs().max().item() < 1e-4
    if damping != 1.0:  # the scales matter: the same schedule undamped is another model
        assert (merged - project_logits(checkpoint, read.schedule, 1.0, x, read.map.parts)).abs().max().item() > 1e-3
    if read.map.parts:  # the zero scales matter: the same schedule with whole layers is another model
        assert (merged - project_logits(checkpoint, read.schedule, damping, x)).abs().max().item() > 1e-3
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "merged")("hi")["input_ids"][-2:] == [104, 105]


ROUND_TRIP_MAPS = ["2,1,1,1,1,1", "1,3,1,2,1,1", "block:2-4:2", "block:0-5:3", "block:4-5:2", "block:3-3:3"]
PARTS_ROUND_TRIP_MAPS = ["1,3a,1,2m,1,1", "2m,1,1,1,1,3a", "block:2-4:2a", "block:0-5:3m", "block:3-3:3a"]


@pytest.mark.parametrize("damping", [1.0, 0.5])
@pytest.mark.parametrize("map_text", PARTS_ROUND_TRIP_MAPS)
def test_a_written_config_with_one_branch_passes_reads_back_as_its_map(map_text, damping, tmp_path):
    from ilr_search.training.mergekit import passthrough_yaml, read_passthrough
    from ilr_search.training.schedule import Map

    chosen = Map.parse(map_text, N_LAYERS)
    read = read_passthrough(write(tmp_path / "m.yml", passthrough_yaml(chosen, damping, "m", N_LAYERS)), N_LAYERS)
    assert (read.map, read.damping) == (chosen, damping) and read.schedule == tuple(chosen.schedule())


@pytest.mark.parametrize("repeat_scale", ["off", "residual"])
@pytest.mark.parametrize("damping", [1.0, 0.5, 0.1])
@pytest.mark.parametrize("map_text", ROUND_TRIP_MAPS)
def test_a_written_config_reads_back_as_its_map_and_knobs(map_text, damping, repeat_scale, tmp_path):
    from ilr_search.training.mergekit import passthrough_yaml, read_passthrough
    from ilr_search.training.schedule import Map

    chosen = Map.parse(map_text, N_LAYERS)
    path = write(
        tmp_path / "m.yml", passthrough_yaml(chosen, damping, "some/model", N_LAYERS, repeat_scale=repeat_scale)
    )
    read = read_passthrough(path, N_LAYERS)
    assert (read.map, read.damping, read.repeat_scale) == (chosen, damping, repeat_scale)
    assert read.schedule == tuple(chosen.schedule()) and read.model == "some/model"


def test_only_a_maps_schedule_has_a_map():
    from ilr_search.training.schedule import Map, map_of_schedule

    assert map_of_schedule([0, 0, 1, 2], 3) == Map.of_counts((2, 1, 1))
    assert map_of_schedule([0, 1, 2, 1, 2], 3) == Map.of_block(1, 2, 2, 3)
    assert map_of_schedule([0, 1, 1, 1, 2], 3) == Map.of_counts((1, 3, 1))  # a block of one layer is its reuse map
    for schedule in ([1, 0], [0, 1], [0, 1, 2, 3], [0, 1, 0, 2, 1], [0, 1, 2, 1, 2, 1, 2, 0]):
        assert map_of_schedule(schedule, 3) is None, schedule


def test_the_baseline_has_no_pass_to_damp(tmp_path):
    from ilr_search.training.mergekit import passthrough_yaml, read_passthrough
    from ilr_search.training.schedule import Map

    text = passthrough_yaml(Map.baseline(N_LAYERS), 0.5, "m", N_LAYERS, repeat_scale="residual")
    read = read_passthrough(write(tmp_path / "b.yml", text), N_LAYERS)
    assert read.key == "1,1,1,1,1,1" and "scale:" not in text


def test_a_checkpoint_is_named_as_mergekit_takes_it(checkpoint, monkeypatch):
    from ilr_search.commands.export import mergekit_model

    assert mergekit_model("hf:HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"
    monkeypatch.chdir(checkpoint.parent)
    assert mergekit_model(checkpoint.name) == str(checkpoint.resolve())


ONE_SOURCE = "  - sources:\n      - model: {model}\n        layer_range: {range}\n"
SCALED = ONE_SOURCE + "        parameters:\n          scale: {scale}\n"


def slices(*parts: str) -> str:
    return "merge_method: passthrough\nslices:\n" + "".join(parts)


BAD_CONFIGS = {  # name: (config text, a phrase of its error line)
    "another merge method": (DAMPED_BLOCK.replace("passthrough", "slerp"), "'slerp'"),
    "two models": (
        slices(
            ONE_SOURCE.format(model="{model}", range="[0, 5]"), ONE_SOURCE.format(model="/other/model", range="[2, 6]")
        ),
        "2 models",
    ),
    "whole models": ("merge_method: passthrough\nmodels:\n  - model: {model}\n", "models:"),
    "two sources in a slice": (
        slices(
            "  - sources:\n      - model: {model}\n        layer_range: [0, 6]\n"
            "      - model: {model}\n        layer_range: [0, 6]\n"
        ),
        "2 sources",
    ),
    "a scale on q_proj": (
        slices(
            ONE_SOURCE.format(model="{model}", range="[0, 5]"),
            SCALED.format(model="{model}", range="[2, 6]", scale="[{{filter: q_proj, value: 0.5}}, {{value: 1.0}}]"),
        ),
        "q_proj",
    ),
    "a scale on every tensor": (
        slices(
            ONE_SOURCE.format(model="{model}", range="[0, 5]"),
            SCALED.format(model="{model}", range="[2, 6]", scale="0.5"),
        ),
        "every tensor",
    ),
    "a gradient": (
        slices(
            ONE_SOURCE.format(model="{model}", range="[0, 5]"),
            SCALED.format(model="{model}", range="[2, 6]", scale="[0.5, 1.0]"),
        ),
        "gradient",
    ),
    "a python tag": ("!!python/object/apply:os.system ['touch {model}/hacked']\n", "python/object"),
    "no map's schedule": (
        slices(
            ONE_SOURCE.format(model="{model}", range="[0, 5]"),
            ONE_SOURCE.format(model="{model}", range="[1, 3]"),
            ONE_SOURCE.format(model="{model}", range="[4, 6]"),
        ),
        "neither a reuse map",
    ),
    "a layer missing": (slices(ONE_SOURCE.format(model="{model}", range="[0, 4]")), "never runs layer(s) 4, 5"),
    "a range outside the model": (slices(ONE_SOURCE.format(model="{model}", range="[0, 7]")), "outside"),
    "a reversed range": (slices(ONE_SOURCE.format(model="{model}", range="[6, 0]")), "reversed"),
    "an empty range": (
        slices(ONE_SOURCE.format(model="{model}", range="[0, 6]"), ONE_SOURCE.format(model="{model}", range="[3, 3]")),
        "empty",
    ),
    "the first pass scaled": (
        slices(
            SCALED.format(
                model="{model}",
                range="[0, 5]",
                scale="[{{filter: o_proj, value: 0.5}}, {{filter: down_proj, value: 0.5}}]",
            ),
            ONE_SOURCE.format(model="{model}", range="[2, 6]"),
        ),
        "first pass",
    ),
    "o_proj alone scaled": (
        slices(
            ONE_SOURCE.format(model="{model}", range="[0, 5]"),
            SCALED.format(model="{model}", range="[2, 6]", scale="[{{filter: o_proj, value: 0.5}}]"),
        ),
        "down_proj by 1",
    ),
    "not a mapping": ("- merge_method\n- passthrough\n", "not a mergekit config"),
    "not YAML": ("merge_method: [passthrough\n", "not YAML"),
}


@pytest.mark.parametrize("case", BAD_CONFIGS)
def test_a_bad_config_is_one_error_line_and_writes_nothing(case, checkpoint, space, cli, tmp_path):
    text, phrase = BAD_CONFIGS[case]
    config = write(tmp_path / "bad.yml", text.format(model=checkpoint))
    db = tmp_path / "new.db"
    proc = cli(*frozen_args(space, checkpoint, f"sqlite:///{db}", "--knobs", "damping", "--enqueue", str(config)))
    assert_one_line_error(proc)
    assert phrase in proc.stderr, proc.stderr
    assert not db.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["bad.yml"]
    assert not (checkpoint / "hacked").exists()


def test_a_damped_config_needs_the_damping_knob_searched(checkpoint, space, cli, tmp_path):
    config = write(tmp_path / "damped.yml", DAMPED_BLOCK.format(model=checkpoint))
    db = tmp_path / "new.db"
    proc = cli(*frozen_args(space, checkpoint, f"sqlite:///{db}", "--enqueue", str(config)))
    assert_one_line_error(proc)
    assert "damping" in proc.stderr and "--knobs" in proc.stderr and not db.exists()
    missing = cli(*frozen_args(space, checkpoint, f"sqlite:///{db}", "--enqueue", str(tmp_path / "none.yml")))
    assert_one_line_error(missing)
    assert "no such file" in missing.stderr and not db.exists()


@pytest.fixture
def scratch_study(tmp_path):
    """A study trained from scratch (the stored test fixture's): no checkpoint to take slices of."""
    with sqlite3.connect(tmp_path / "old.db") as conn:
        conn.executescript((ROOT / "tests" / "fixtures" / "study-eeb668a.sql").read_text(encoding="utf-8"))
    return f"sqlite:///{tmp_path / 'old.db'}"


BAD_EXPORTS = {  # name: (arguments, a phrase of the error line)
    "a study trained from scratch": (
        ["--study", "before-typed-records", "--storage", "{scratch}", "--map", "2,1,1,1"],
        "from scratch",
    ),
    "a knob that is no scale": (
        ["--study", STUDY, "--storage", "{url}", "--map", "block:2-4:2|injection=add"],
        "injection",
    ),
    "repeat_scale lr": (["--study", STUDY, "--storage", "{url}", "--map", "block:2-4:2|repeat_scale=lr"], "'lr'"),
    "adapters": (["--study", STUDY, "--storage", "{url}", "--map", "block:2-4:2|adapters=4"], "--format hf"),
    "--model": (["--model", "{tmp}/none"], "goes with --study"),
    "--family": (["--study", STUDY, "--storage", "{url}", "--family", "qwen2"], "--family"),
}


@pytest.mark.parametrize("case", BAD_EXPORTS)
def test_a_bad_mergekit_export_is_one_error_line_and_writes_nothing(case, study, scratch_study, cli, tmp_path):
    url, _ = study
    args, phrase = BAD_EXPORTS[case]
    before = sorted(p.name for p in tmp_path.iterdir())
    out = tmp_path / "model.yml"
    proc = cli(
        "export-model",
        *[a.format(url=url, scratch=scratch_study, tmp=tmp_path) for a in args],
        "--format",
        "mergekit",
        "--out",
        str(out),
    )
    assert_one_line_error(proc)
    assert phrase in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("out,phrase", [("model.txt", "extension"), ("taken.yml", "exists")])
def test_the_mergekit_out_is_a_new_yaml_file(out, phrase, study, cli, tmp_path):
    url, _ = study
    taken = write(tmp_path / "taken.yml", "keep\n")
    proc = cli(
        "export-model",
        "--study",
        STUDY,
        "--storage",
        url,
        "--map",
        "block:2-4:2",
        "--format",
        "mergekit",
        "--out",
        str(tmp_path / out),
    )
    assert_one_line_error(proc)
    assert phrase in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.yml"] and taken.read_text() == "keep\n"
    assert_one_line_error(
        cli("export-model", "--study", STUDY, "--storage", url, "--format", "onnx", "--out", str(tmp_path / "x.yml"))
    )
