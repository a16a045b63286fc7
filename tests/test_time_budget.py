"""`run --time-budget` (and `[search] time_budget`): the whole study (trials, reference runs, race) keeps within one
invocation's wall-clock budget; a run stopped by it ends cleanly (exit 0) with an answer that says what is undecided,
and the same command goes on toward the decision, training nothing twice.

No test here waits on real time. The search reads its clock through one seam (ilr_search.time_budget.clock), which
these tests set to a clock that moves one minute at every look; the search looks once as the run starts and once
before each group of runs it would start (a group is one run here: the space trains one map at a time), so a budget
of N minutes lets N - 1 runs start: a step-count budget. The run is kept in this process (one usable core: no race
worker processes, which would read their own clock)."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from conftest import RACE, assert_one_line_error, run_cli, write_space
from helpers import race_rows, run_args, storage_url

import ilr_search.search.race as race_module
from ilr_search import time_budget
from ilr_search.analysis.race_core import Measure
from ilr_search.commands.dryrun import Estimate, PlanTimeBudget, Probe, plan_time_budget
from ilr_search.search.plan import CONFIG_ATTR
from ilr_search.time_budget import format_duration, parse_duration

MINUTE = 60.0
SEARCH = {**RACE, "pruner": "none"}  # 3 trials, every one complete, then the race at --target 2x
STOPPED = "no decision yet: the time budget"
CONTINUES = "; the same command continues"


def minute_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search's clock, moved a minute at every look (and the run kept in this process, where that clock is)."""
    ticks = itertools.count()
    monkeypatch.setattr(time_budget, "clock", lambda: MINUTE * next(ticks))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # one usable core: no race worker processes


def stored_trials(db: Path, study: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=study, storage=storage_url(db)).trials


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("15m", 900), ("90s", 90), ("1h", 3600), ("1.5h", 5400), ("1h30m", 5400), ("900", 900), (" 2m 30s ", 150)],
)
def test_durations_are_read_as_people_write_them(text, seconds):
    assert parse_duration(text) == seconds
    assert parse_duration(format_duration(seconds)) == seconds


def test_durations_are_written_as_people_read_them():
    assert [format_duration(s) for s in (900, 90, 5400, 45, 86400 + 60)] == ["15m", "1m 30s", "1h 30m", "45s", "1d 1m"]


def test_a_budget_spent_in_the_trials_stops_cleanly_and_the_same_command_goes_on(cli, tmp_path, monkeypatch):
    """The space's budget (2m: one run) stops the study after its first trial: exit 0, nothing raced, the answer
    undecided. The same command with --time-budget 3m (over the space's 2m: two runs) opens the same study and
    trains the two trials left, and stops before the race: no trial trained twice, the budget nowhere in the
    study's stored configuration."""
    minute_clock(monkeypatch)
    space = write_space(tmp_path / "s.toml", search={**SEARCH, "time_budget": "2m"})
    db = tmp_path / "b.db"
    args = run_args(space, db, "budgeted", "--target", "2x")

    first = cli(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads(first.stdout)
    assert summary["out_of_time"] and summary["time_budget_seconds"] == 2 * MINUTE
    assert summary["answer"] == (f"{STOPPED} (2m) ran out after 1 of 3 trials; the race has not started{CONTINUES}")
    assert summary["answer_details"][0].startswith("time budget 2m: spent; no new run started after it")
    assert summary["n_trials"] == 1 and race_rows(db) == []
    assert "the time budget (2m) is spent: no new run starts" in first.stderr

    second = cli(*args, "--time-budget", "3m")
    assert second.returncode == 0, second.stderr[-3000:]
    resumed = json.loads(second.stdout)
    assert resumed["study"] == "budgeted" and resumed["time_budget_seconds"] == 3 * MINUTE
    assert resumed["out_of_time"] and resumed["n_complete"] == 3 and resumed["n_failed"] == 0
    assert resumed["answer"].startswith(f"{STOPPED} (3m) ran out; the race has not reached its tests yet (")
    assert resumed["answer"].endswith(CONTINUES) and race_rows(db) == []
    trials = stored_trials(db, "budgeted")
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 3
    assert len({json.dumps(t.params, sort_keys=True) for t in trials}) == 3  # three maps, each trained once
    stored = optuna.load_study(study_name="budgeted", storage=storage_url(db)).user_attrs[CONFIG_ATTR]
    assert "time_budget" not in json.dumps(stored)


# Bad budgets: the flag's text, or the space's value. Each exits 2 with one error line, and writes nothing.
BAD_FLAGS = ["15q", "soon", "0", "-5m", "1h30x", "", "nan", "inf", "2y"]
BAD_SPACES = ["soon", True, 0, -30]


@pytest.mark.parametrize(("flag", "toml"), [(f, None) for f in BAD_FLAGS] + [(None, t) for t in BAD_SPACES])
def test_a_bad_budget_is_one_error_line_and_writes_nothing(cli, tmp_path, flag, toml):
    space = write_space(tmp_path / "s.toml", search=SEARCH if toml is None else {**SEARCH, "time_budget": toml})
    before = sorted(p.name for p in tmp_path.rglob("*"))
    extra = ["--time-budget", flag] if flag is not None else []
    proc = cli(*run_args(space, tmp_path / "b.db", "bad", "--target", "2x", *extra))
    assert_one_line_error(proc)
    assert ("--time-budget" if flag is not None else "time_budget") in proc.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no database, no checkpoint folder


@pytest.mark.parametrize(
    ("low", "high", "fits", "words"),
    [(60, 120, "yes", "fits within it"), (60, 600, "maybe", "may exceed it"), (400, 600, "no", "exceeds it")],
)
def test_the_plan_says_how_the_estimate_stands_against_the_budget(low, high, fits, words):
    probe = Probe("baseline", [1, 1, 1, 1], 4, 1, 1, 0.01, 0.01, [0.01])
    estimate = Estimate((probe, probe), (1.0, 1.0), "1 process", 1.0, 0.0, (0.0, 0.0), low, high, "")
    plan = plan_time_budget(300, estimate, finished=False)
    assert (plan.fits, plan.text) == (fits, "5m") and words in plan.line
    assert plan_time_budget(300, None, finished=True) == PlanTimeBudget(300, "5m", None, "nothing is left to train")


def test_the_dry_run_shows_the_plan_against_the_budget_and_the_same_study(cli, tmp_path):
    """`run --dry-run --time-budget 1.5h` puts the estimate beside the budget (its verdict the estimate's own); the
    study is the one the same command without a budget plans (the budget is no part of its identity); nothing is
    written."""
    space = write_space(tmp_path / "s.toml", search=SEARCH)
    base = ["run", "--space", str(space), "--budget", "1.5x", "--storage", storage_url(tmp_path / "b.db")]
    plan = json.loads(cli(*base, "--time-budget", "1.5h", "--dry-run", "--json", check=True).stdout)
    budget, low, high = plan["time_budget"], plan["estimated_seconds"], plan["estimated_seconds_max"]
    assert (budget["seconds"], budget["text"]) == (5400, "1h 30m")
    assert budget["fits"] == ("yes" if high <= 5400 else "maybe" if low <= 5400 else "no")
    plain = json.loads(cli(*base, "--dry-run", "--json", check=True).stdout)
    assert plain["time_budget"] is None and plain["study"] == plan["study"]
    text = cli(*base, "--time-budget", "90s", "--dry-run", check=True).stdout
    assert "time budget" in text and "1m 30s: the estimate" in text
    assert not (tmp_path / "b.db").exists()


class Trained:
    """The race runs trained, as (map, steps, seed), in the order they were trained (over both invocations)."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, int, int]] = []
        self.real = race_module.train_claimed

    def __call__(self, store, runs, *args, **kwargs):
        self.runs += [(r.job.map_key, r.train_cfg.steps, r.job.seed) for r in runs]
        return self.real(store, runs, *args, **kwargs)


@pytest.fixture(scope="module")
def stopped_and_resumed(tmp_path_factory, token_cache) -> Iterator[tuple[Path, dict, dict, list, Trained]]:
    """A study stopped by its budget in the race (13m: the 3 trials and 9 race runs start, the 10th does not), then
    the same command without a budget: (database, the stopped run's summary, the resumed run's, the race runs
    stored after the stop, the race runs trained)."""
    root = tmp_path_factory.mktemp("time-budget")
    # a narrow model: how far the budget lets the race go is counted in looks at the clock, not in training
    space = write_space(root / "s.toml", search=SEARCH, model={"d_model": 16, "seq_len": 32})
    db = root / "b.db"
    args = run_args(space, db, "budgeted", "--target", "2x")
    trained = Trained()
    env = {"ILR_SEARCH_CACHE": str(token_cache)}
    with pytest.MonkeyPatch.context() as m:
        minute_clock(m)
        m.setattr(race_module, "train_claimed", trained)
        stopped = run_cli([*args, "--time-budget", "13m"], root, env)
        assert stopped.returncode == 0, stopped.stderr[-3000:]
        after_stop = race_rows(db)
        resumed = run_cli(args, root, env)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    yield db, json.loads(stopped.stdout), json.loads(resumed.stdout), after_stop, trained


@pytest.mark.slow
def test_a_budget_spent_in_the_race_stops_undecided_with_the_gap_it_could_see(stopped_and_resumed):
    """Stopped in the race: exit 0, the answer undecided, with the race's own detectable gap at the test seeds it
    has (or that it has too few to say one), and that the same command continues; 9 race runs stored."""
    _, stopped, _, after_stop, trained = stopped_and_resumed
    assert stopped["out_of_time"] and stopped["time_budget_seconds"] == 13 * MINUTE
    answer = stopped["answer"]
    assert answer.startswith(f"{STOPPED} (13m) ran out; ") and answer.endswith(CONTINUES), answer
    gap = stopped["detectable_gap"]
    if gap is not None:  # the race's own computation, as its JSON gives it
        assert f"a gap of {Measure(gap['judged']).amount(gap['amount'])} or more would have been seen by now" in answer
        assert f"undecided after {gap['seeds']} test seeds" in answer or "every comparison with" in answer
    else:
        assert "too few test seeds yet" in answer or "has not reached its tests yet" in answer
    assert len(after_stop) == 9 == len(trained.runs[:9])
    assert all(row["state"] == "complete" for row in after_stop)  # the run in flight as the budget ran out finished


@pytest.mark.slow
def test_the_same_command_without_a_budget_goes_on_to_the_decision(stopped_and_resumed):
    _, stopped, resumed, _, _ = stopped_and_resumed
    assert resumed["study"] == stopped["study"] == "budgeted"
    assert not resumed["out_of_time"] and resumed["time_budget_seconds"] is None
    assert resumed["answer"].startswith(("use ", "no map beat")), resumed["answer"]


@pytest.mark.slow
def test_no_run_is_trained_twice_across_the_stop(stopped_and_resumed):
    """Every race run (map, steps, seed) trained once over both invocations, each stored once and complete; the
    trials trained once each (three, all complete: none failed and queued again)."""
    db, _, resumed, _, trained = stopped_and_resumed
    assert len(trained.runs) == len(set(trained.runs)) > 9
    rows = race_rows(db)
    assert sorted((r["map_key"], r["steps"], r["seed"]) for r in rows) == sorted(trained.runs)
    assert all(r["state"] == "complete" for r in rows)
    trials = stored_trials(db, "budgeted")
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 3
    assert resumed["n_trials"] == resumed["n_complete"] == 3


@pytest.mark.slow
def test_worker_processes_are_given_the_deadline_and_start_nothing_once_it_is_spent(tmp_path, token_cache):
    """`--workers 2`: each spawned worker receives the invocation's deadline and reads its own clock against it. A
    deadline already spent (its end at the clock's zero, whatever the real time) lets no worker, nor the parent's
    last pass, start a trial: exit codes 0, nothing trained, the answer undecided."""
    from ilr_search.commands.run import RunRequest, run_study
    from ilr_search.space import load_space
    from ilr_search.time_budget import Deadline

    space = load_space(write_space(tmp_path / "s.toml", search={**SEARCH, "time_budget": "15m"}))
    request = RunRequest(
        space,
        "1.5x",
        "workers",
        storage_url(tmp_path / "w.db"),
        workers=2,
        checkpoint_dir=tmp_path / "checkpoints",
        deadline=Deadline(15 * MINUTE, 0.0),
    )
    report = run_study(request)
    assert report.workers is not None and [code for _, code in report.workers] == [0, 0]
    assert report.out_of_time and report.n_trials == 0 and not report.interrupted
    assert report.answer.line == f"{STOPPED} (15m) ran out after 0 of 3 trials; the race has not started{CONTINUES}"
