"""Frozen search of a pretrained model's reuse map (`run --init DIR --train-steps 0`): a positive control and the
input it refuses.

The positive control: the in-package model (4 layers, d_model 32) is trained with reuse map 2,2,1,1 on the embedded
corpus, and its 4 distinct layers are written as a plain 4-layer transformers checkpoint. Run as it is (1,1,1,1)
that checkpoint skips the second passes it learned with, so a frozen search of it must find 2,2,1,1 (or a map at
least as good) and its race must claim it over the all-ones map, by window chunk."""

import json
import math
from pathlib import Path

import pytest
from conftest import assert_one_line_error, write_space

TRAINED_MAP = [2, 2, 1, 1]
PRETRAIN_STEPS = 300
FROZEN = {"noise_seeds": 0, "families": ["ilr"], "max_reuse": 2, "n_trials": 4, "race_seeds": 3, "max_seeds": 6,
          "race_contenders": 2, "enqueue_paper_maps": False}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny pretrained checkpoint: the in-package model trained with map 2,2,1,1 (seed 0, byte tokens), its four
    distinct layers exported as a plain 4-layer Llama (schedule 0,1,2,3) with the byte tokenizer."""
    import os

    from ilr_search.training.pretrained import export_checkpoint

    from ilr_search.config import DataConfig, ModelConfig, TrainConfig
    from ilr_search.data.tokens import load_tokens
    from ilr_search.training.schedule import reuse_map_schedule
    from ilr_search.training.train import train_proxy

    cache = tmp_path_factory.mktemp("frozen-cache")
    os.environ.setdefault("ILR_SEARCH_CACHE", str(cache))
    data = load_tokens(DataConfig(), seq_len=64)
    model_cfg = ModelConfig(vocab_size=256, n_layers=4, d_model=32, n_heads=2, seq_len=64)
    trained = []
    result = train_proxy(model_cfg, reuse_map_schedule(TRAINED_MAP), data,
                         TrainConfig(steps=PRETRAIN_STEPS, batch_size=8, lr=1e-2, eval_fractions=(1.0,),
                                     eval_windows=16, seed=0, device="cpu", dtype="fp32", checkpoint_every=0),
                         on_trained=trained.append)
    assert result.status == "ok", result.reason
    return export_checkpoint(trained[0], [0, 1, 2, 3], tmp_path_factory.mktemp("pretrained") / "tiny-llama")


def frozen_run(cli, tmp_path: Path, checkpoint: Path, *extra: str):
    space = write_space(tmp_path / "frozen.toml", search=FROZEN, train={"eval_windows": 16})
    db = tmp_path / "frozen.db"
    proc = cli("run", "--space", str(space), "--init", str(checkpoint), "--train-steps", "0", "--budget", "1.5x",
               "--enqueue", "2,2,1,1", "--storage", f"sqlite:///{db}", "--json", *extra)
    return proc, db


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
    best = summary["best"]
    assert best["beats_baseline"]
    results = {(r["map_key"], r["seed"]): r["val_loss"] for r in race["results"]}
    best_loss = math.fsum(v for (k, _), v in results.items() if k == best["map"])
    assert best["map"] == "2,2,1,1" or best_loss <= math.fsum(v for (k, _), v in results.items() if k == "2,2,1,1")
    # the race's words are windows, and nothing says "0 steps"
    verdict = summary["verdict"]
    assert "window chunk" in verdict and "0 steps" not in verdict and "seed" not in verdict, verdict
    # every result is an evaluation: no step trained, the trials on chunk 0, the race on the chunks after it
    assert all(r["steps"] == 0 for r in race["results"])
    assert {r["seed"] for r in race["results"] if r["source"].startswith("trial")} == {0}
    assert {r["seed"] for r in race["results"] if r["source"].startswith("run")} <= set(range(1, 6))
    print(f"positive control: {verdict}")
    base = [results[("1,1,1,1", s)] for s in claimed["seeds"]]
    mine = [results[("2,2,1,1", s)] for s in claimed["seeds"]]
    print(f"chunks {claimed['seeds']}: 1,1,1,1 {[round(x, 4) for x in base]}; 2,2,1,1 {[round(x, 4) for x in mine]}")


def test_a_resume_with_another_checkpoint_is_refused(cli, tmp_path, checkpoint):
    import shutil

    proc, db = frozen_run(cli, tmp_path, checkpoint, "--study", "frozen-resume", "--n-trials", "1", "--max-seeds", "3")
    assert proc.returncode == 0, proc.stderr
    other = tmp_path / "other"
    shutil.copytree(checkpoint, other)
    proc = cli("run", "--space", str(tmp_path / "frozen.toml"), "--init", str(other), "--train-steps", "0",
               "--budget", "1.5x", "--study", "frozen-resume", "--storage", f"sqlite:///{db}")
    assert_one_line_error(proc)
    assert "init" in proc.stderr


def test_per_window_losses_pair_maps_by_window(checkpoint, token_cache):
    from ilr_search.training.pretrained import open_checkpoint

    from ilr_search.config import DataConfig, TrainConfig
    from ilr_search.data.tokens import load_tokens
    from ilr_search.training.frozen import chunk_window_losses
    from ilr_search.training.schedule import reuse_map_schedule
    from ilr_search.training.train import build_model

    model = build_model(open_checkpoint(str(checkpoint), seq_len=64).config, 0)
    data = load_tokens(DataConfig(tokenizer="byte"), seq_len=64)
    cfg = TrainConfig(steps=0, eval_windows=16, device="cpu", dtype="fp32")
    plain, = chunk_window_losses(model, [0, 1, 2, 3], data, cfg, [1])
    recurrent, = chunk_window_losses(model, reuse_map_schedule(TRAINED_MAP), data, cfg, [1])
    assert plain.starts == recurrent.starts and len(plain.losses) == 16
    assert plain.val_loss == pytest.approx(sum(plain.losses) / 16)
    better = sum(r < p for r, p in zip(recurrent.losses, plain.losses))
    assert better >= 12, (recurrent.losses, plain.losses)


def no_database(tmp_path: Path) -> bool:
    return not any(tmp_path.glob("*.db")) and not (tmp_path / "studies").exists()


def test_frozen_without_a_checkpoint_is_refused(cli, tmp_path):
    proc = cli("run", "--space", "tests/spaces/tiny.toml", "--train-steps", "0", "--budget", "1.5x",
               "--storage", f"sqlite:///{tmp_path / 'x.db'}", cwd=Path(__file__).resolve().parent.parent)
    assert_one_line_error(proc)
    assert "--init" in proc.stderr and not (tmp_path / "x.db").exists()


def test_shape_flags_beside_init_are_refused(cli, tmp_path, checkpoint):
    proc = cli("run", "--init", str(checkpoint), "--layers", "4", "--train-steps", "0", "--budget", "1.5x",
               "--storage", f"sqlite:///{tmp_path / 'x.db'}")
    assert_one_line_error(proc)
    assert "--layers" in proc.stderr and no_database(tmp_path)


def test_a_missing_checkpoint_folder_is_refused(cli, tmp_path):
    proc = cli("run", "--init", str(tmp_path / "nowhere"), "--train-steps", "0", "--budget", "1.5x",
               "--storage", f"sqlite:///{tmp_path / 'x.db'}")
    assert_one_line_error(proc)
    assert "nowhere" in proc.stderr and no_database(tmp_path)
