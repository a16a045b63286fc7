"""`run --workers N`: N processes on one study, no map trained twice, the trial count reached exactly."""

import json
import sqlite3
from collections import Counter

import optuna

from conftest import ROOT, assert_one_line_error
from ilr_search.config import ModelConfig
from ilr_search.commands.autofuse import proxy_memory_bytes

TINY = ["--space", str(ROOT / "tests" / "spaces" / "tiny.toml"), "--layers", "3", "--d-model", "16",
        "--seq-len", "32", "--steps", "16"]


def test_two_workers_finish_the_study_with_no_map_trained_twice(cli, tmp_path):
    proc = cli("run", *TINY, "--budget", "2x", "--n-trials", "7", "--workers", "2", "--pruner", "none",
               "--storage", "sqlite:///w.db", "--study", "w", "--json", check=True)
    summary = json.loads(proc.stdout)
    assert [w["exit_code"] for w in summary["workers"]] == [0, 0]
    study = optuna.load_study(study_name="w", storage=f"sqlite:///{tmp_path / 'w.db'}")
    trials = study.get_trials(deepcopy=False)
    finished = [t for t in trials if t.state.is_finished()]
    assert len(finished) == 7 and summary["n_trials"] == 7, [t.state for t in trials]
    trained = Counter(t.user_attrs["map_key"] for t in finished if "reused_from" not in t.user_attrs)
    assert trained and max(trained.values()) == 1, trained
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    # both workers trained (each registered its own sampling stream), and each reference exists once
    with sqlite3.connect(tmp_path / "w.db") as db:
        workers = db.execute("select count(*) from ilr_map_claims where map_key like 'worker:%'").fetchone()[0]
    assert workers >= 3  # two workers and the parent's final pass
    assert {"baseline_seed1", "baseline_seed2", "second_seed"} <= set(summary["references"])


def test_workers_below_one_is_refused(cli):
    proc = cli("run", *TINY, "--budget", "2x", "--workers", "0", "--storage", "sqlite:///w.db")
    assert_one_line_error(proc)
    assert "--workers" in proc.stderr


def test_proxy_memory_grows_with_layer_runs_batch_and_dtype():
    cfg = ModelConfig(vocab_size=1024, n_layers=4, d_model=128, n_heads=4, seq_len=1024)
    one = proxy_memory_bytes(cfg, 4, 64, bf16=True)
    assert proxy_memory_bytes(cfg, 8, 64, bf16=True) > one
    assert proxy_memory_bytes(cfg, 4, 128, bf16=True) > one
    assert proxy_memory_bytes(cfg, 4, 64, bf16=False) > one
    assert 0.5 * 2**30 < one < 8 * 2**30  # the paper-small proxy: a few GiB, not MiB or TiB


def test_two_workers_each_fusing_their_own_group_train_no_map_twice(cli, tmp_path):
    proc = cli("run", *TINY, "--budget", "2x", "--n-trials", "9", "--workers", "2", "--fuse", "3", "--pruner", "none",
               "--storage", "sqlite:///wf.db", "--study", "wf", "--json", check=True)
    summary = json.loads(proc.stdout)
    assert [w["exit_code"] for w in summary["workers"]] == [0, 0]
    trials = optuna.load_study(study_name="wf", storage=f"sqlite:///{tmp_path / 'wf.db'}").get_trials(deepcopy=False)
    finished = [t for t in trials if t.state.is_finished()]
    assert len(finished) == 9 and summary["n_trials"] == 9, [t.state for t in trials]
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    trained = Counter(t.user_attrs["map_key"] for t in finished if "reused_from" not in t.user_attrs)
    assert trained and max(trained.values()) == 1, trained
    assert max(t.user_attrs.get("fused_group", 1) for t in finished) > 1  # the workers trained groups fused
    with sqlite3.connect(tmp_path / "wf.db") as db:
        workers = db.execute("select count(*) from ilr_map_claims where map_key like 'worker:%'").fetchone()[0]
    assert workers >= 3  # two workers and the parent's final pass
    assert {"baseline_seed1", "baseline_seed2", "second_seed"} <= set(summary["references"])
