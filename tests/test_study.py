import fcntl
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import optuna
import pytest
from conftest import ROOT, assert_one_line_error, run_cli
from helpers import HANG_SECONDS, digest, hold_the_first_until_the_other_works, run_args, signal_if_still, wait_until

from ilr_search.config import ModelConfig
from ilr_search.search.maps import first_maps, repair_to_budget
from ilr_search.training.flops import parse_budget

# tests/spaces/cli.toml: the default space's settings at test size, without reference runs
CLI_SPACE = ROOT / "tests" / "spaces" / "cli.toml"
TINY = ["--layers", "4", "--d-model", "32", "--heads", "2", "--seq-len", "64", "--batch-size", "8", "--dtype", "fp32"]
# tiny_study's model, narrower: what its tests read (counts, stored facts, budgets, refusals) needs no size
NARROW = ["--layers", "4", "--d-model", "16", "--heads", "2", "--seq-len", "32", "--batch-size", "8", "--dtype", "fp32"]


def load(db, name):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{db}")


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory, token_cache):
    """One real 6-trial study shared by the read-only tests below."""
    root = tmp_path_factory.mktemp("study")
    db = root / "s.db"
    args = run_args(CLI_SPACE, db, "tiny", *NARROW, steps=20, n_trials=6)
    proc = run_cli(args, root, {"ILR_SEARCH_CACHE": str(token_cache)})
    assert proc.returncode == 0, proc.stderr
    return root, db, json.loads(proc.stdout)


@pytest.mark.slow
def test_run_end_to_end_and_resume_to_more_trials(tiny_study, cli):
    root, db, summary = tiny_study
    assert summary["n_complete"] + summary["n_pruned"] == 6 and summary["n_failed"] == 0
    assert set(summary) >= {
        "study",
        "storage",
        "n_trials",
        "n_complete",
        "n_pruned",
        "n_failed",
        "steps_trained",
        "steps_saved_by_pruning",
        "pareto",
    }
    assert summary["pareto"] and all(
        set(p)
        == {
            "trial",
            "reuse_map",
            "flops_ratio",
            "val_ppl",
            "val_bpb",
            "steps",
            "seeds",
            "interval",
            "confirmed",
            "reference",
        }
        for p in summary["pareto"]
    )
    listed = json.loads(cli("trials", "--study", "tiny", "--storage", f"sqlite:///{db}", "--json", check=True).stdout)
    assert len(listed["trials"]) == 6
    assert set(listed["trials"][0]) >= {
        "trial",
        "state",
        "reuse_map",
        "flops_ratio",
        "val_ppl",
        "val_bpb",
        "steps",
        "pruned_at_step",
    }
    # the all-ones baseline and front-loaded maps come first
    assert listed["trials"][0]["reuse_map"] == [1, 1, 1, 1] and listed["trials"][1]["reuse_map"] == [2, 1, 1, 1]
    studies = json.loads(cli("studies", "--storage", f"sqlite:///{db}", "--json", check=True).stdout)["studies"]
    assert studies[0]["study"] == "tiny" and studies[0]["layers"] == 4 and studies[0]["budget"] == "1.5x"

    # resuming to 9 adds exactly three finished trials to a copy of the study
    copy = root / "copy.db"
    copy.write_bytes(db.read_bytes())
    more = json.loads(cli(*run_args(CLI_SPACE, copy, "tiny", *NARROW, steps=20, n_trials=9), check=True).stdout)
    finished = [t for t in load(copy, "tiny").trials if t.state.is_finished()]
    assert len(finished) == 9 and more["n_complete"] + more["n_pruned"] == 9
    # rerunning at the target trains nothing more
    again = json.loads(cli(*run_args(CLI_SPACE, copy, "tiny", *NARROW, steps=20, n_trials=9), check=True).stdout)
    assert again["steps_trained"] == more["steps_trained"]


@pytest.mark.slow
def test_each_fact_is_stored_once_and_a_trial_commits_in_few_transactions(tiny_study):
    """Curves live in the store only (not in the trials' attributes), every trained trial has its whole curve
    there, and a trial's result attributes are one transaction, not one per attribute."""
    _, db, _ = tiny_study
    from ilr_search.analysis.results import curves_by_trial
    from ilr_search.storage import open_store, parse_storage

    trials = load(db, "tiny").trials
    curves = curves_by_trial(open_store(parse_storage(f"sqlite:///{db}"), "tiny", read_only=True).curve_points())
    assert not any("curve" in t.user_attrs for t in trials)
    for t in trials:
        if t.state == optuna.trial.TrialState.COMPLETE and "reused_from" not in t.user_attrs:
            assert sorted(curves[t.number]) == [2, 5, 10, 20], (t.number, curves.get(t.number))


@pytest.mark.slow
def test_a_trial_writes_its_attributes_in_two_transactions(tmp_path, token_cache):
    """The proposal's attributes and the result's are one transaction each (an fsync each on SQLite), not one
    per attribute (14 per trial before)."""
    import sqlalchemy as sa

    from ilr_search.search import RunRequest, run_in_process
    from ilr_search.space import load_space

    per_transaction: list[int] = []  # user-attribute writes of each committed transaction
    pending: dict[int, int] = {}

    def on_execute(conn, cursor, statement, *args):
        if statement.lstrip().startswith("INSERT INTO trial_user_attributes"):
            key = id(conn.connection.dbapi_connection)
            pending[key] = pending.get(key, 0) + 1

    def on_commit(conn):
        count = pending.pop(id(conn.connection.dbapi_connection), 0)
        if count:
            per_transaction.append(count)

    space = load_space(
        ROOT / "tests" / "spaces" / "tiny.toml",
        {"search": {"noise_seeds": 0, "families": ["ilr"], "enqueue_paper_maps": False}, "train": {"steps": 8}},
    )
    sa.event.listen(sa.engine.Engine, "before_cursor_execute", on_execute)
    sa.event.listen(sa.engine.Engine, "commit", on_commit)
    try:
        run_in_process(RunRequest(space, "2x", "tx", f"sqlite:///{tmp_path / 'tx.db'}", n_trials=3, pruner="none"))
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", on_execute)
        sa.event.remove(sa.engine.Engine, "commit", on_commit)
    trials = load(tmp_path / "tx.db", "tx").trials
    assert len(trials) == 3 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert len(per_transaction) == 2 * 3, per_transaction  # proposal + result, per trial
    assert sum(per_transaction) == sum(len(t.user_attrs) for t in trials)


@pytest.mark.slow
def test_no_completed_trial_is_over_budget(tiny_study):
    _, db, _ = tiny_study
    cfg = ModelConfig(n_layers=4, d_model=16, n_heads=2, seq_len=32)  # tiny_study's model (NARROW)
    budget = parse_budget("1.5x", cfg)
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT t.number, a.value_json FROM trials t JOIN trial_user_attributes a ON a.trial_id = t.trial_id "
            "WHERE a.key = 'reuse_map' AND t.state = 'COMPLETE'"
        ).fetchall()
    assert len(rows) >= 6
    from ilr_search.training.flops import flops_ratio
    from ilr_search.training.schedule import reuse_map_schedule

    for number, value in rows:
        assert budget.allows(flops_ratio(cfg, reuse_map_schedule(json.loads(value)))), (number, value)


def test_repair_keeps_maps_within_budget_and_their_shape():
    assert repair_to_budget([1, 1, 1, 1], 6) == [1, 1, 1, 1]
    assert repair_to_budget([2, 1, 2, 1], 6) == [2, 1, 2, 1]
    assert repair_to_budget([4, 1, 3, 2], 6) == [2, 1, 2, 1]
    for m in ([4, 4, 4, 4], [1, 4, 1, 4], [3, 3, 1, 1]):
        repaired = repair_to_budget(m, 6)
        assert sum(repaired) == 6 and all(1 <= r <= x for r, x in zip(repaired, m, strict=True))
    assert first_maps(4, 4, 6)[0] == [1, 1, 1, 1] and all(sum(m) <= 6 for m in first_maps(4, 4, 6))


@pytest.mark.slow
def test_kill_9_loses_no_trial_and_the_killed_one_is_retried(tmp_path, token_cache):
    db = tmp_path / "k.db"
    env = {**os.environ, "ILR_SEARCH_CACHE": str(token_cache), "ILR_SEARCH_HEARTBEAT_SECONDS": "1"}
    # 120 steps (of a narrow model) with a checkpoint every 50 (cli.toml): the kill lands inside the second or third
    # trial of four, past a checkpoint (the event is seen again with the run stopped), so that a trial is still to
    # train after it; the resume trains the killed trial's retry from that checkpoint
    args = run_args(
        CLI_SPACE, db, "killed", *TINY, "--d-model", "16", "--seq-len", "32", "--pruner", "none", steps=120, n_trials=4
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "ilr_search", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def past_a_checkpoint() -> bool:  # a trial past its first checkpoint, after one or two finished
        trials = load(db, "killed").trials
        complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
        running = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING and "reuse_map" in t.user_attrs]
        checkpoints = list((tmp_path / "studies" / "checkpoints" / "killed").glob("*.pt"))
        return 1 <= len(complete) <= 2 and bool(running) and bool(checkpoints)

    try:
        wait_until(
            lambda: signal_if_still(proc, past_a_checkpoint, signal.SIGKILL), "a trial past its first checkpoint", proc
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    before = {t.number: (t.state, t.values) for t in load(db, "killed").trials}
    killed = [n for n, (s, _) in before.items() if s == optuna.trial.TrialState.RUNNING]
    assert len(killed) == 1
    # The same command resumes at once: the killed trial still looks alive until its heartbeat goes stale, and the
    # run waits for it, sweeps it as stale and retries it, rather than needing the caller to wait.
    resumed = run_cli(args, tmp_path, {"ILR_SEARCH_CACHE": str(token_cache), "ILR_SEARCH_HEARTBEAT_SECONDS": "1"})
    assert resumed.returncode == 0, resumed.stderr
    after = {t.number: t for t in load(db, "killed").trials}
    for n, (state, values) in before.items():  # every finished trial is kept as it was
        if state == optuna.trial.TrialState.COMPLETE:
            assert after[n].state == state and after[n].values == values
    assert after[killed[0]].state == optuna.trial.TrialState.FAIL
    retries = [t for t in after.values() if t.system_attrs.get("failed_trial") == killed[0]]
    assert retries and retries[0].state == optuna.trial.TrialState.COMPLETE
    assert retries[0].user_attrs["reuse_map"] == after[killed[0]].user_attrs["reuse_map"]
    assert retries[0].user_attrs["resumed_from_step"] >= 50  # the retry resumed from the killed trial's checkpoint
    assert not list((tmp_path / "studies" / "checkpoints" / "killed").glob("*.pt"))  # deleted when trials end
    assert not [t for t in after.values() if t.state == optuna.trial.TrialState.RUNNING]


@pytest.mark.slow
@pytest.mark.parametrize("storage_kind", ["sqlite", "journal"])
def test_two_processes_share_a_study_without_training_a_map_twice(tmp_path, token_cache, storage_kind):
    storage = f"sqlite:///{tmp_path / 'w.db'}" if storage_kind == "sqlite" else f"journal:{tmp_path / 'w.log'}"
    # heartbeats a minute apart: a worker held stopped below never looks dead, however slowly the other starts
    env = {**os.environ, "ILR_SEARCH_CACHE": str(token_cache), "ILR_SEARCH_HEARTBEAT_SECONDS": "60"}
    args = run_args(CLI_SPACE, storage, "pair", *TINY, "--sampler", "random", steps=30, n_trials=10)
    errs = [tmp_path / f"worker{i}.err" for i in range(2)]
    procs = []
    for err in errs:
        with err.open("w") as stderr:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "ilr_search", *args],
                    cwd=tmp_path,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    text=True,
                )
            )

    def storage_free() -> bool:
        """No process holds the storage's write lock (nor, for SQLite, a read lock that would block a write)."""
        if storage_kind == "journal":
            with open(tmp_path / "w.log.flock", "a") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False
                fcntl.flock(lock, fcntl.LOCK_UN)
                return True
        db = sqlite3.connect(tmp_path / "w.db", timeout=0)
        try:
            db.execute("BEGIN EXCLUSIVE")
            db.rollback()
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            db.close()

    # both workers do work whatever their speeds: the first to train waits, stopped, for the other to train too
    hold_the_first_until_the_other_works(procs, lambda i: "training map" in errs[i].read_text(), storage_free)
    outs = [p.communicate(timeout=HANG_SECONDS)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), [err.read_text()[-2000:] for err in errs]
    from ilr_search.storage import open_storage, parse_storage

    study = optuna.load_study(study_name="pair", storage=open_storage(parse_storage(storage)))
    trials = study.trials
    finished = [t for t in trials if t.state.is_finished()]
    # exactly the target: a trial asked once the trials before it reach it stops untrained (refuse_surplus)
    assert len([t for t in finished if t.state != optuna.trial.TrialState.FAIL]) == 10
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    trained = Counter(t.user_attrs["map_key"] for t in finished if t.user_attrs.get("steps", 0) > 0)
    assert trained and max(trained.values()) == 1, trained
    # both workers did work: each trained at least one map itself
    assert all(json.loads(out)["study"] == "pair" for out in outs)
    assert all("training map" in err.read_text() for err in errs), [err.read_text()[-1000:] for err in errs]


BAD_RUNS = {
    "unknown sampler": ["--sampler", "cmaes"],
    "bad budget": ["--budget", "abc"],
    "budget below baseline": ["--budget", "0.5x"],
    "zero trials": ["--n-trials", "0"],
    "negative trials": ["--n-trials", "-3"],
    "unsupported driver": ["--storage", "mongodb://localhost/x"],
    "unknown pruner": ["--pruner", "hyperband"],
    "incompatible resume": ["--d-model", "64"],
    "incompatible steps": ["--steps", "21"],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD_RUNS))
def test_bad_run_input_changes_nothing(tiny_study, cli, case):
    root, db, _ = tiny_study
    before = digest(db)
    args = run_args(CLI_SPACE, db, "tiny", *NARROW, steps=20, n_trials=6)
    extra = BAD_RUNS[case]
    for i, a in enumerate(extra[::2]):  # replace an option already present, or add it
        if a in args:
            args[args.index(a) + 1] = extra[2 * i + 1]
        else:
            args += [a, extra[2 * i + 1]]
    proc = cli(*args)
    assert_one_line_error(proc)
    if case.startswith("incompatible"):
        assert "cannot resume" in proc.stderr and ("d_model" in proc.stderr or "steps" in proc.stderr)
    assert digest(db) == before


def test_unwritable_and_corrupted_storage(tmp_path, cli):
    # sysfs refuses new files even to root; a missing folder is not created
    assert_one_line_error(cli(*run_args(CLI_SPACE, Path("/sys/ilr-search-test.db"), "x", *TINY, steps=20, n_trials=6)))
    assert not Path("/sys/ilr-search-test.db").exists()
    missing = tmp_path / "no-such-folder" / "s.db"
    assert_one_line_error(cli(*run_args(CLI_SPACE, missing, "x", *TINY, steps=20, n_trials=6)))
    assert not (tmp_path / "no-such-folder").exists()
    corrupted = tmp_path / "bad.db"
    corrupted.write_bytes(b"this is not a database" * 100)
    before = digest(corrupted)
    assert_one_line_error(cli(*run_args(CLI_SPACE, corrupted, "x", *TINY, steps=20, n_trials=6)))
    assert_one_line_error(cli("trials", "--study", "x", "--storage", f"sqlite:///{corrupted}"))
    assert_one_line_error(cli("studies", "--storage", f"sqlite:///{corrupted}"))
    assert digest(corrupted) == before


@pytest.mark.slow
def test_trials_for_unknown_study(tiny_study, cli, tmp_path):
    _, db, _ = tiny_study
    before = digest(db)
    proc = cli("trials", "--study", "nope", "--storage", f"sqlite:///{db}")
    assert_one_line_error(proc)
    assert "tiny" in proc.stderr  # says which studies exist
    assert digest(db) == before
    missing = tmp_path / "never.db"
    assert_one_line_error(cli("trials", "--study", "nope", "--storage", f"sqlite:///{missing}"))
    assert not missing.exists()


def test_storage_password_is_never_printed(cli):
    for url in ("postgresql://user:hunter2@127.0.0.1:9/db", "mysql://user:hunter2@127.0.0.1:9/db"):
        for args in (
            ["studies", "--storage", url],
            ["trials", "--study", "x", "--storage", url],
            ["run", "--space", str(CLI_SPACE), *TINY, "--budget", "1.5x", "--steps", "2", "--storage", url],
        ):
            proc = cli(*args)
            assert proc.returncode == 2
            assert "hunter2" not in proc.stdout + proc.stderr
            if url.startswith("postgresql"):  # psycopg is installed (the test extra): the URL is shown masked
                assert "***" in proc.stderr, proc.stderr
            else:  # no MySQL driver here: the error names the missing driver, and no password
                assert "not installed" in proc.stderr, proc.stderr
