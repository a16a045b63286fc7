"""Faults a long search meets: killed workers, locks, read-only and full disks, divergence, Ctrl-C.
Every test runs the real `ilr-search run` in subprocesses against real storages."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from conftest import NO_REFERENCES, assert_one_line_error, write_space
from ilr_search.space import load_space
from ilr_search.storage import open_storage, open_store, parse_storage
from ilr_search.results import has_result, study_front
from ilr_search.search.run import run_study

HEARTBEAT_SECONDS = 1
GRACE_SECONDS = 4 * HEARTBEAT_SECONDS + 1  # storage.grace_period() under ILR_SEARCH_HEARTBEAT_SECONDS=1


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    """The tiny space without reference runs: none of these faults concerns them, and every run that reaches
    its target would train three more proxies (per worker, for the concurrent ones)."""
    return str(write_space(tmp_path_factory.mktemp("space") / "faults.toml", search=NO_REFERENCES))


def run_cmd(space, storage, study, n_trials, *extra, steps=24):
    return [sys.executable, "-m", "ilr_search", "run", "--space", space, "--budget", "1.5x", "--study", study,
            "--storage", storage, "--n-trials", str(n_trials), "--steps", str(steps), "--json", *extra]


def env_for(token_cache, **extra):
    return {**os.environ, "ILR_SEARCH_CACHE": str(token_cache),
            "ILR_SEARCH_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS), **extra}


def setup_run(space, storage, study, n_trials, tmp_path, token_cache):
    """The run that makes the study a fault then meets, in this process (the faulty run is a real subprocess)."""
    summary = run_study(load_space(space), "1.5x", study, storage, n_trials=n_trials,
                        checkpoint_dir=tmp_path / "studies" / "checkpoints")
    assert summary["n_complete"] + summary["n_pruned"] == n_trials


def wait_until_stale(killed_at: float) -> None:
    """A killed worker's last heartbeat is at most `killed_at`: once the grace period has passed since then, the
    next run finds its trial stale (a fixed shorter sleep raced the next run's start-up)."""
    time.sleep(max(0.0, killed_at + GRACE_SECONDS + 0.2 - time.time()))


def load(storage, study):
    return optuna.load_study(study_name=study, storage=open_storage(parse_storage(storage), heartbeat=False))


def wait_for(predicate, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if predicate():
                return
        except Exception:
            pass
        time.sleep(0.3)
    pytest.fail(f"timed out waiting for {what}")


def check_accounted(storage, study_name):
    """No trial left RUNNING, every killed trial failed and retried, no map trained twice to the end, and the
    stored front equals the front recomputed from the trials."""
    study = load(storage, study_name)
    trials = study.trials
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    failed = [t for t in trials if t.state == TrialState.FAIL and not has_result(t)]
    for f in failed:
        retries = [t for t in trials if t.system_attrs.get("failed_trial") == f.number
                   or t.user_attrs.get("retry_of") == f.number]
        assert retries, f"failed trial {f.number} was not retried"
    trained = Counter(t.user_attrs["map_key"] for t in trials if has_result(t) and t.user_attrs.get("steps", 0) > 0)
    assert trained and max(trained.values()) == 1, trained
    history = open_store(parse_storage(storage), study_name).front_history()
    stored = history[max(history)]
    assert [p["trial"] for p in stored] == [p["trial"] for p in study_front(trials)]
    return study


def test_locked_sqlite_waits_with_a_message_then_proceeds(tmp_path, token_cache, space):
    db = tmp_path / "locked.db"
    storage = f"sqlite:///{db}"
    env = env_for(token_cache)
    setup_run(space, storage, "lock", 2, tmp_path, token_cache)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sqlite3, sys, time\n"
        f"c = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
        "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(6); c.execute('ROLLBACK')")],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    started = time.time()
    proc = subprocess.run(run_cmd(space, storage, "lock", 3), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    holder.wait()
    assert proc.returncode == 0, proc.stderr
    assert "locked by another process" in proc.stderr
    assert time.time() - started >= 4
    assert json.loads(proc.stdout)["n_complete"] + json.loads(proc.stdout)["n_pruned"] == 3


@pytest.fixture
def small_mount(tmp_path):
    """A 1 MiB tmpfs (a disk that fills), mounted for the test; skips where mounting is not permitted."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs as root and must be able to mount a tmpfs: {proc.stderr.strip()}")
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def integrity(db: Path) -> str:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


def test_read_only_storage_is_refused_and_untouched(small_mount, tmp_path, token_cache, space):
    db = small_mount / "ro.db"
    storage = f"sqlite:///{db}"
    env = env_for(token_cache)
    # a subprocess: this process must not hold the database open for writing, or the remount is refused (busy)
    assert subprocess.run(run_cmd(space, storage, "ro", 2), cwd=tmp_path, env=env, capture_output=True, timeout=300).returncode == 0
    before = db.read_bytes()
    subprocess.run(["mount", "-o", "remount,ro", str(small_mount)], check=True)
    proc = subprocess.run(run_cmd(space, storage, "ro", 4), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert_one_line_error(proc)
    assert db.read_bytes() == before and integrity(db) == "ok"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        assert conn.execute("SELECT COUNT(*) FROM trials WHERE state IN ('COMPLETE', 'PRUNED')").fetchone()[0] == 2


def test_full_disk_gives_a_clear_error_and_keeps_finished_trials(small_mount, tmp_path, token_cache, space):
    db = small_mount / "full.db"
    storage = f"sqlite:///{db}"
    env = env_for(token_cache)
    setup_run(space, storage, "full", 2, tmp_path, token_cache)
    finished = {t.number: t.values for t in load(storage, "full").trials if t.state.is_finished()}
    filler = small_mount / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:  # fill the disk to the last byte
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    proc = subprocess.run(run_cmd(space, storage, "full", 6), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    # the run had started (its progress is on stderr): it ends with one error line, exit 2, no traceback
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[-1].startswith("error: ") and "full" in lines[-1]
    filler.unlink()
    assert integrity(db) == "ok"
    kept = {t.number: t.values for t in load(storage, "full").trials if t.state.is_finished() and t.number in finished}
    assert kept == finished
    # with space again, the same command resumes
    again = subprocess.run(run_cmd(space, storage, "full", 4), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]


def test_diverging_proxy_fails_with_its_reason_and_the_study_goes_on(tmp_path, token_cache, space):
    storage = f"sqlite:///{tmp_path / 'div.db'}"
    proc = subprocess.run(run_cmd(space, storage, "div", 3, "--lr", "10"), cwd=tmp_path, env=env_for(token_cache),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    trials = load(storage, "div").trials
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert summary["n_failed"] == len(failed) >= 3
    assert all(t.user_attrs["status"] == "diverged" and "loss" in t.user_attrs["reason"] for t in failed)


def test_ctrl_c_stops_within_seconds_with_trials_recorded(tmp_path, token_cache, space):
    storage = f"sqlite:///{tmp_path / 'int.db'}"
    env = env_for(token_cache)
    cmd = run_cmd(space, storage, "int", 3, "--pruner", "none", steps=200)
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: sum(t.state == TrialState.COMPLETE for t in load(storage, "int").trials) >= 1
                 and any(t.state == TrialState.RUNNING and "reuse_map" in t.user_attrs for t in load(storage, "int").trials),
                 240, "a finished trial and a running one")
        time.sleep(0.5)
        sent = time.time()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        elapsed = time.time() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert elapsed < 5, elapsed
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    trials = load(storage, "int").trials
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    interrupted = [t for t in trials if t.state == TrialState.FAIL]
    assert len(interrupted) == 1 and "interrupted" in interrupted[0].user_attrs.get("reason", "")
    resumed = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    check_accounted(storage, "int")
