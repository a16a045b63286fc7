"""`ilr-search judge`: candidates raced against the model they were made from, no search. On the checkpoint trained
with 2,2,1,1, that map is claimed better; the model itself and a block damped to 1e-7 (the model but for float
rounding) are never claimed either way; a mergekit config is read into its map; the study resumes and is read by
the other commands; bad candidates are one error line."""

import json
import sqlite3
from pathlib import Path

import pytest
from conftest import assert_one_line_error, one_core, write_space

PER_CHUNK = 8


def judge(cli, tmp_path: Path, checkpoint: Path, *candidates: str, extra: tuple[str, ...] = ()):
    space = write_space(tmp_path / "judge.toml", train={"eval_windows": PER_CHUNK})
    db = tmp_path / "judge.db"
    args = [
        "judge",
        "--space",
        str(space),
        "--init",
        str(checkpoint),
        "--storage",
        f"sqlite:///{db}",
        "--chunks",
        "8",
        "--json",
        *extra,
    ]
    for c in candidates:
        args += ["--candidate", c]
    return cli(*args), db


def race_runs(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("select count(*) from ilr_runs where kind = 'race' and state = 'complete'").fetchone()[0]


@pytest.fixture(scope="module")
def judged(recurrent_checkpoint, tmp_path_factory, token_cache):
    """One judge of four candidates on the 2,2,1,1 checkpoint, kept for the tests that read it."""
    from conftest import run_cli

    root = tmp_path_factory.mktemp("judged")
    layer_scan = root / "layer-scan.yml"  # layer-scan's shape: slices [0, 3] + [1, 4] of the one model
    layer_scan.write_text(
        "merge_method: passthrough\nslices:\n"
        f"  - sources:\n      - model: {recurrent_checkpoint}\n        layer_range: [0, 3]\n"
        f"  - sources:\n      - model: {recurrent_checkpoint}\n        layer_range: [1, 4]\n",
        encoding="utf-8",
    )
    space = write_space(root / "judge.toml", train={"eval_windows": PER_CHUNK})
    args = [
        "judge",
        "--space",
        str(space),
        "--init",
        str(recurrent_checkpoint),
        "--storage",
        f"sqlite:///{root / 'judge.db'}",
        "--chunks",
        "8",
        "--json",
    ]
    for c in ("2,2,1,1", "1,1,1,1|damping=0.5", "block:1-2:2|damping=1e-7", str(layer_scan)):
        args += ["--candidate", c]
    with one_core():  # raced in this process: no race worker processes to start (conftest.one_core)
        proc = run_cli(args, root, {"ILR_SEARCH_CACHE": str(token_cache)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, args, proc


@pytest.mark.slow
def test_judge_claims_the_map_the_checkpoint_was_trained_with_and_nothing_it_cannot_tell(judged):
    root, _, proc = judged
    summary = json.loads(proc.stdout)
    by_map = {c["map"]: c for c in summary["race"]["comparisons"]}
    assert set(by_map) == {"2,2,1,1", "block:1-2:2|damping=1e-07", "block:1-2:2"}, by_map
    assert by_map["2,2,1,1"]["status"] == "better"
    # the model but for float rounding: never claimed either way, however many windows are paired
    rounding = by_map["block:1-2:2|damping=1e-07"]
    assert rounding["status"] not in ("better", "worse") and rounding["units"] >= 3 * PER_CHUNK, rounding
    assert abs(rounding["mean_diff"]) < 1e-4
    answer = summary["answer"]
    assert answer.startswith("2,2,1,1 is better than tiny-llama by ") and "90% interval" in answer, answer
    details = summary["answer_details"]
    assert any(
        line.startswith("block:1-2:2 with damping=1e-07 is not distinguishable from tiny-llama: a gap of")
        for line in details
    ), details
    # the model itself (damping acts on repeated passes only: the plain map with it is the plain map) is said to be
    # so, and judged against nothing
    assert "1,1,1,1|damping=0.5 runs every layer once: it is the model itself" in proc.stderr
    assert "layer-scan.yml reads as block:1-2:2" in proc.stderr
    for word in ("seed", "training", "0 steps", "proxy"):
        assert word not in " ".join([answer, *details]), word


@pytest.mark.slow
def test_the_same_judge_command_resumes_with_nothing_to_evaluate(judged, token_cache):
    from conftest import run_cli

    root, args, first = judged
    before = race_runs(root / "judge.db")
    again = run_cli(args, root, {"ILR_SEARCH_CACHE": str(token_cache)})
    assert again.returncode == 0, again.stderr
    assert race_runs(root / "judge.db") == before
    assert json.loads(again.stdout)["answer"] == json.loads(first.stdout)["answer"]


@pytest.mark.slow
def test_a_judged_study_is_read_by_trials_pareto_and_studies(judged, token_cache):
    from conftest import run_cli

    root, _, proc = judged
    study = json.loads(proc.stdout)["study"]
    answer = json.loads(proc.stdout)["answer"]
    storage = f"sqlite:///{root / 'judge.db'}"
    # the layers view weighs the knobs too: a candidate without damping has the default
    for command in (["trials"], ["pareto"], ["pareto", "--view", "layers"]):
        shown = run_cli(
            [*command, "--study", study, "--storage", storage], root, {"ILR_SEARCH_CACHE": str(token_cache)}
        )
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.splitlines()[0] == answer
    listed = run_cli(["studies", "--storage", storage, "--json"], root, {"ILR_SEARCH_CACHE": str(token_cache)})
    assert json.loads(listed.stdout)["studies"][0]["study"] == study
    # a candidate whose knobs are all at their defaults has none, as the plain model has none (not an empty text)
    rows = json.loads(
        run_cli(
            ["trials", "--study", study, "--storage", storage, "--json"], root, {"ILR_SEARCH_CACHE": str(token_cache)}
        ).stdout
    )["trials"]
    assert {r["map"]: r["knobs"] for r in rows}["block:1-2:2"] is None
    assert all(r["knobs"] != "" for r in rows)


@pytest.mark.parametrize(
    "config,words",
    [
        ("merge_method: slerp\nslices:\n  - sources:\n      - model: M\n        layer_range: [0, 4]\n", "slerp"),
        (
            "merge_method: passthrough\nslices:\n  - sources:\n      - model: A\n        layer_range: [0, 3]\n"
            "  - sources:\n      - model: B\n        layer_range: [1, 4]\n",
            "model",
        ),
    ],
)
def test_a_yaml_that_is_no_passthrough_of_one_model_is_one_error_line(
    cli, tmp_path, recurrent_checkpoint, config, words
):
    yml = tmp_path / "merge.yml"
    yml.write_text(config, encoding="utf-8")
    proc, db = judge(cli, tmp_path, recurrent_checkpoint, str(yml))
    assert_one_line_error(proc)
    assert words in proc.stderr and not db.exists()


@pytest.mark.parametrize(
    "extra,words",
    [
        (("--budget", "1.2x"), "over --budget"),
        (("--chunks", "2"), "--chunks"),
    ],
)
def test_bad_judge_requests_are_one_error_line(cli, tmp_path, recurrent_checkpoint, extra, words):
    proc, db = judge(cli, tmp_path, recurrent_checkpoint, "2,2,1,1", extra=extra)
    assert_one_line_error(proc)
    assert words in proc.stderr and not db.exists()


@pytest.mark.slow
def test_the_export_carries_each_chunks_scores_by_unit(judged, token_cache):
    """Each frozen race run's per-window scores leave with the export, in the order the race paired them: their
    mean is the run's loss, and runs of one chunk are paired unit by unit."""
    import pandas as pd
    from conftest import run_cli

    root, _, proc = judged
    out = root / "runs.csv"
    exported = run_cli(
        [
            "export",
            "--study",
            json.loads(proc.stdout)["study"],
            "--storage",
            f"sqlite:///{root / 'judge.db'}",
            "--out",
            str(out),
        ],
        root,
        {"ILR_SEARCH_CACHE": str(token_cache)},
    )
    assert exported.returncode == 0, exported.stderr
    runs = pd.read_csv(out).query("state == 'RACE_RUN' and run_state == 'complete'")
    assert len(runs) >= 2
    for _, run in runs.iterrows():
        scores = json.loads(run["unit_scores"])
        assert len(scores) == PER_CHUNK
        assert abs(sum(scores) / len(scores) - run["val_loss"]) < 1e-6


def test_a_judge_writes_a_map_that_repeats_one_layer_as_that_layers_block():
    """A judge's candidates on a deep model are blocks: a one-layer block given as block:15-15:3 (whose key is the
    reuse map 1,...,3,...) is written back as the block, as a study of blocks writes it; a study of ILR maps keeps
    the counts."""
    from ilr_search.config import SpaceConfig
    from ilr_search.search.race_results import race_settings

    config = SpaceConfig().to_dict()
    assert race_settings(config).words.shown("1,2,1,1,1,1,1,1") == "1,2,1,1,1,1,1,1"
    config["search"]["judge"] = True
    judged = race_settings(config)
    assert judged.words.shown("1,2,1,1,1,1,1,1|damping=0.1") == "block:1-1:2|damping=0.1"
    assert judged.words.shown("2,2,1,1,1,1,1,1") == "2,2,1,1,1,1,1,1"  # two layers repeated: a reuse map, no block
