"""Frozen search of a pretrained model's reuse map (`run --init DIR --train-steps 0`): a positive control and the
input it refuses.

The positive control: the in-package model (4 layers, d_model 32) is trained with reuse map 2,2,1,1 on the embedded
corpus, and its 4 distinct layers are written as a plain 4-layer transformers checkpoint. Run as it is (1,1,1,1)
that checkpoint skips the second passes it learned with, so a frozen search of it must find 2,2,1,1 (or a map at
least as good) and its race must claim it over the all-ones map, by window chunk."""

import dataclasses
import json
import math
from pathlib import Path

import pytest
from conftest import TRAINED_MAP, assert_one_line_error, frozen_run_args, write_space

# frozen and trained studies that race, as on one core: no race worker processes (conftest.one_core)
pytestmark = pytest.mark.usefixtures("one_usable_core")

FROZEN = {
    "noise_seeds": 0,
    "families": ["ilr"],
    "max_reuse": 2,
    "n_trials": 4,
    "race_seeds": 3,
    "max_seeds": 6,
    "race_contenders": 2,
    "enqueue_paper_maps": False,
}


@pytest.fixture(scope="module")
def checkpoint(recurrent_checkpoint) -> Path:
    """The tiny pretrained checkpoint trained with 2,2,1,1 (conftest.recurrent_checkpoint)."""
    return recurrent_checkpoint


def frozen_run(cli, tmp_path: Path, checkpoint: Path, *extra: str):
    space = write_space(tmp_path / "frozen.toml", search=FROZEN, train={"eval_windows": 16})
    db = tmp_path / "frozen.db"
    proc = cli(
        *frozen_run_args(space, checkpoint, "1.5x", f"sqlite:///{db}"),
        "--enqueue",
        "2,2,1,1",
        "--json",
        *extra,
    )
    return proc, db


@pytest.mark.slow
def test_a_frozen_search_finds_the_map_the_checkpoint_was_trained_with(cli, tmp_path, checkpoint):
    proc, _ = frozen_run(cli, tmp_path, checkpoint)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    race = summary["race"]
    assert race["frozen"] and race["target_steps"] == 0 and summary["equal_compute"] is None
    by_map = {c["map"]: c for c in race["comparisons"]}
    assert "2,2,1,1" in by_map, by_map
    claimed = by_map["2,2,1,1"]
    assert claimed["status"] == "better", claimed
    results = {(r["map_key"], r["seed"]): r["val_loss"] for r in race["results"]}
    chunks = claimed["seeds"]

    def mean_loss(key: str) -> float:
        return math.fsum(results[(key, s)] for s in chunks) / len(chunks)

    # the race's best claim is 2,2,1,1 or a map at least as good on the same window chunks
    best = min(
        (
            c["map"]
            for c in race["comparisons"]
            if c["status"] == "better" and all((c["map"], s) in results for s in chunks)
        ),
        key=mean_loss,
    )
    assert best == "2,2,1,1" or mean_loss(best) <= mean_loss("2,2,1,1")
    # the race's words are windows, and nothing says "0 steps"
    verdict = summary["verdict"]
    assert "window chunk" in verdict and "0 steps" not in verdict and "seed" not in verdict, verdict
    # the answer names the claimed map first, in the same words
    answer = summary["answer"]
    assert answer.startswith(f"use {best}:") and "window chunk" in answer, answer
    assert not any("seed" in line or "0 steps" in line for line in [answer, *summary["answer_details"]]), summary
    # every result is an evaluation: no step trained, the trials on chunk 0, the race on the chunks after it
    assert all(r["steps"] == 0 for r in race["results"])
    assert {r["seed"] for r in race["results"] if r["source"].startswith("trial")} == {0}
    tried = {r["map_key"] for r in race["results"] if r["source"].startswith("trial")}
    runs = [r for r in race["results"] if r["source"].startswith("run")]
    assert {r["seed"] for r in runs} <= set(range(6))  # the pool: max_seeds chunks
    assert all(r["map_key"] not in tried for r in runs if r["seed"] == 0)  # chunk 0: only a map no trial scored
    print(f"positive control: {answer}\n{verdict}")
    for key in sorted({k for k, _ in results}):
        print(key, {s: round(v, 4) for (k, s), v in sorted(results.items()) if k == key})


@pytest.mark.slow
def test_a_resume_with_another_checkpoint_is_refused(cli, tmp_path, checkpoint):
    import shutil

    proc, db = frozen_run(cli, tmp_path, checkpoint, "--study", "frozen-resume", "--n-trials", "1", "--max-seeds", "3")
    assert proc.returncode == 0, proc.stderr
    other = tmp_path / "other"
    shutil.copytree(checkpoint, other)
    proc = cli(
        *frozen_run_args(tmp_path / "frozen.toml", other, "1.5x", f"sqlite:///{db}"),
        "--study",
        "frozen-resume",
    )
    assert_one_line_error(proc)
    assert "init" in proc.stderr


def test_per_window_losses_pair_maps_by_window(checkpoint, token_cache):
    from ilr_search.config import DataConfig, TrainConfig
    from ilr_search.data.tokens import load_tokens
    from ilr_search.training.frozen import chunk_scores
    from ilr_search.training.pretrained import open_checkpoint
    from ilr_search.training.schedule import reuse_map_schedule

    model_cfg = open_checkpoint(str(checkpoint), seq_len=64).config
    data = load_tokens(DataConfig(tokenizer="byte"), seq_len=64)
    cfg = TrainConfig(steps=0, eval_windows=16, device="cpu", dtype="fp32")
    (plain,) = chunk_scores(model_cfg, [0, 1, 2, 3], data, cfg, [1])
    (recurrent,) = chunk_scores(model_cfg, reuse_map_schedule(TRAINED_MAP), data, cfg, [1])
    assert plain.units == recurrent.units and len(plain.scores) == 16
    assert plain.val_loss == pytest.approx(sum(plain.scores) / 16)
    better = sum(r < p for r, p in zip(recurrent.scores, plain.scores, strict=True))
    assert better >= 12, (recurrent.scores, plain.scores)


def no_database(tmp_path: Path) -> bool:
    return not any(tmp_path.glob("*.db")) and not (tmp_path / "studies").exists()


def test_frozen_without_a_checkpoint_is_refused(cli, tmp_path):
    proc = cli(
        "run",
        "--space",
        "tests/spaces/tiny.toml",
        "--train-steps",
        "0",
        "--budget",
        "1.5x",
        "--storage",
        f"sqlite:///{tmp_path / 'x.db'}",
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert_one_line_error(proc)
    assert "--init" in proc.stderr and not (tmp_path / "x.db").exists()


def test_shape_flags_beside_init_are_refused(cli, tmp_path, checkpoint):
    proc = cli(
        "run",
        "--init",
        str(checkpoint),
        "--layers",
        "4",
        "--train-steps",
        "0",
        "--budget",
        "1.5x",
        "--storage",
        f"sqlite:///{tmp_path / 'x.db'}",
    )
    assert_one_line_error(proc)
    assert "--layers" in proc.stderr and no_database(tmp_path)


def test_a_missing_checkpoint_folder_is_refused(cli, tmp_path):
    proc = cli(
        "run",
        "--init",
        str(tmp_path / "nowhere"),
        "--train-steps",
        "0",
        "--budget",
        "1.5x",
        "--storage",
        f"sqlite:///{tmp_path / 'x.db'}",
    )
    assert_one_line_error(proc)
    assert "nowhere" in proc.stderr and no_database(tmp_path)


def test_retrofit_continues_training_from_the_checkpoint(checkpoint, token_cache):
    """--train-steps N > 0: build_model loads the checkpoint (init) and train_proxy trains on from it. A few steps
    at a small learning rate keep the pretrained loss, far below a random model's, and move it."""
    from ilr_search.config import DataConfig, TrainConfig
    from ilr_search.data.tokens import load_tokens
    from ilr_search.training.pretrained import open_checkpoint
    from ilr_search.training.schedule import reuse_map_schedule
    from ilr_search.training.train import train_proxy

    model = open_checkpoint(str(checkpoint), seq_len=64).config
    data = load_tokens(DataConfig(tokenizer=f"file:{checkpoint / 'tokenizer.json'}"), seq_len=64)
    schedule = reuse_map_schedule(TRAINED_MAP)
    base = TrainConfig(
        steps=0,
        eval_windows=16,
        batch_size=8,
        lr=1e-4,
        eval_fractions=(1.0,),
        device="cpu",
        dtype="fp32",
        checkpoint_every=0,
    )
    frozen = train_proxy(model, schedule, data, base)
    retrofit = train_proxy(model, schedule, data, dataclasses.replace(base, steps=4))
    assert frozen.steps == 0 and retrofit.steps == 4 and retrofit.status == "ok"
    assert retrofit.val_loss < math.log(256) - 2  # far from a random model's ~ln 256
    assert abs(retrofit.val_loss - frozen.val_loss) < 0.5
    assert retrofit.curve[-1].step == 4 and frozen.curve[0].step == 0
