"""Faults a long search meets: killed workers, locks, read-only and full disks, divergence, Ctrl-C.
Every test runs the real `ilr-search run` in subprocesses against real storages."""

import json
import os
import signal
import subprocess
import sys
from collections import Counter

import optuna
import pytest
from conftest import NO_REFERENCES, run_cli, write_space
from helpers import HANG_SECONDS, sigint_as_in_a_terminal, signal_if_still, wait_until
from optuna.trial import TrialState

from ilr_search.analysis.results import study_front
from ilr_search.search.run import RunRequest, run_in_process
from ilr_search.space import load_space
from ilr_search.storage import open_storage, open_store, parse_storage
from ilr_search.storage.trials import told_trials

HEARTBEAT_SECONDS = 1


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    """The tiny space without reference runs: none of these faults concerns them, and every run that reaches
    its target would train three more proxies (per worker, for the concurrent ones)."""
    return str(write_space(tmp_path_factory.mktemp("space") / "faults.toml", search=NO_REFERENCES))


def run_cmd(space, storage, study, n_trials, *extra, steps=24):
    return [
        sys.executable,
        "-m",
        "ilr_search",
        "run",
        "--space",
        space,
        "--budget",
        "1.5x",
        "--study",
        study,
        "--storage",
        storage,
        "--n-trials",
        str(n_trials),
        "--steps",
        str(steps),
        "--json",
        *extra,
    ]


def env_for(token_cache, **extra):
    return {
        **os.environ,
        "ILR_SEARCH_CACHE": str(token_cache),
        "ILR_SEARCH_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
        **extra,
    }


def setup_run(space, storage, study, n_trials, tmp_path, token_cache):
    """The run that makes the study a fault then meets, in this process (the faulty run is a real subprocess)."""
    summary = run_in_process(
        RunRequest(
            load_space(space),
            "1.5x",
            study,
            storage,
            n_trials=n_trials,
            checkpoint_dir=tmp_path / "studies" / "checkpoints",
        )
    ).to_json()
    assert summary["n_complete"] + summary["n_pruned"] == n_trials


def load(storage, study):
    return optuna.load_study(study_name=study, storage=open_storage(parse_storage(storage)))


def check_accounted(storage, study_name):
    """No trial left RUNNING, every killed trial failed and retried, no map trained twice to the end, and the
    stored front equals the front recomputed from the trials."""
    study = load(storage, study_name)
    trials = study.trials
    records = told_trials(study)
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    failed = [r for r in records if r.state == TrialState.FAIL and not r.has_result]
    for f in failed:
        retries = [
            t
            for t in trials
            if t.system_attrs.get("failed_trial") == f.number or t.user_attrs.get("retry_of") == f.number
        ]
        assert retries, f"failed trial {f.number} was not retried"
    trained = Counter(r.map_key for r in records if r.has_result and r.steps > 0)
    assert trained and max(trained.values()) == 1, trained
    history = open_store(parse_storage(storage), study_name).front_history()
    stored = history[max(history)]
    assert [p.trial for p in stored] == [p.trial for p in study_front(records)]
    return study


@pytest.mark.slow
def test_locked_sqlite_waits_with_a_message_then_proceeds(tmp_path, token_cache, space):
    """A run that meets a database locked by another process says so and waits; once the lock is released (here:
    as soon as the run has said it waits), it proceeds and finishes."""
    db = tmp_path / "locked.db"
    storage = f"sqlite:///{db}"
    env = env_for(token_cache)
    setup_run(space, storage, "lock", 2, tmp_path, token_cache)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sqlite3, sys\n"
                f"c = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
                "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); sys.stdin.readline(); c.execute('ROLLBACK')"
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    proc = subprocess.Popen(
        run_cmd(space, storage, "lock", 3),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    said = []
    try:
        for line in proc.stderr:  # the lock is held until the run says it waits for it
            said.append(line)
            if "locked by another process" in line:
                break
        holder.communicate("release\n", timeout=HANG_SECONDS)
        out, err = proc.communicate(timeout=HANG_SECONDS)
    finally:
        for p in (proc, holder):
            if p.poll() is None:
                p.kill()
    assert any("locked by another process" in line for line in said), "".join(said)[-2000:]
    assert proc.returncode == 0, err[-2000:]
    assert json.loads(out)["n_complete"] + json.loads(out)["n_pruned"] == 3


@pytest.mark.slow
def test_diverging_proxy_fails_with_its_reason_and_the_study_goes_on(tmp_path, token_cache, space):
    storage = f"sqlite:///{tmp_path / 'div.db'}"
    proc = subprocess.run(
        run_cmd(space, storage, "div", 3, "--lr", "10"),
        cwd=tmp_path,
        env=env_for(token_cache),
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    trials = load(storage, "div").trials
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert summary["n_failed"] == len(failed) >= 3
    assert all(t.user_attrs["status"] == "diverged" and "loss" in t.user_attrs["reason"] for t in failed)


@pytest.mark.slow
def test_ctrl_c_stops_within_a_step_with_trials_recorded(tmp_path, token_cache, space):
    """Ctrl-C in the middle of a trial's training ends the run at once: it stops inside the step in flight, records
    the finished trial and the interrupted one, and exits. "At once" is judged in steps, not seconds (a loaded
    machine slows the run and this test alike): the interrupted trial reaches no evaluation past the one after
    the evaluation seen when the signal was sent, and not its end. The signal goes on an event (the second trial
    past its first evaluation), seen again with the run stopped (SIGSTOP) and sent before it goes on, so that no
    step runs between seeing it and the signal; a third trial is still to train, so that the run does not end
    first. 100-step proxies of a narrow model: the step in flight is judged against evaluations 25 steps apart."""
    storage = f"sqlite:///{tmp_path / 'int.db'}"
    env = env_for(token_cache)
    steps = 100
    cmd = run_cmd(space, storage, "int", 3, "--pruner", "none", "--d-model", "16", "--seq-len", "32", steps=steps)
    evals = [round(steps * f) for f in load_space(space).train.eval_fractions]
    seen: list[int] = []  # the running trial's evaluated steps when the signal goes

    def training_second_trial() -> bool:
        """A trial past its first evaluation and short of its last (still training), after one trial completed."""
        trials = load(storage, "int").trials
        running = {t.number for t in trials if t.state == TrialState.RUNNING}
        points = [p.step for p in open_store(parse_storage(storage), "int").curve_points() if p.trial_number in running]
        seen[:] = points
        return sum(t.state == TrialState.COMPLETE for t in trials) >= 1 and bool(points) and max(points) < steps

    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_in_a_terminal,
    )
    try:
        wait_until(
            lambda: signal_if_still(proc, training_second_trial, signal.SIGINT),
            "a finished trial and a running one past its first evaluation",
            proc,
        )
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    trials = load(storage, "int").trials
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    interrupted = [t for t in trials if t.state == TrialState.FAIL]
    assert len(interrupted) == 1 and "interrupted" in interrupted[0].user_attrs.get("reason", "")
    reached = max(
        p.step
        for p in open_store(parse_storage(storage), "int").curve_points()
        if p.trial_number == interrupted[0].number
    )
    assert reached < steps and reached <= evals[evals.index(max(seen)) + 1], (seen, reached, evals)
    resumed = run_cli(
        cmd[3:],
        tmp_path,
        {"ILR_SEARCH_CACHE": str(token_cache), "ILR_SEARCH_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS)},
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    check_accounted(storage, "int")
    assert sum(t.state == TrialState.COMPLETE for t in load(storage, "int").trials) == 3
