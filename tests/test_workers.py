"""`run --workers N`: N processes on one study, no map trained twice, the trial count reached exactly."""

import json
import sqlite3
from collections import Counter

import optuna
import pytest
from conftest import ROOT, assert_one_line_error
from helpers import HANG_SECONDS

from ilr_search.commands.autofuse import proxy_memory_bytes
from ilr_search.config import ModelConfig

TINY = [
    "--space",
    str(ROOT / "tests" / "spaces" / "tiny.toml"),
    "--layers",
    "3",
    "--d-model",
    "16",
    "--seq-len",
    "32",
    "--steps",
    "16",
]


@pytest.mark.slow
def test_two_workers_finish_the_study_with_no_map_trained_twice(cli, tmp_path):
    proc = cli(
        "run",
        *TINY,
        "--budget",
        "2x",
        "--n-trials",
        "7",
        "--workers",
        "2",
        "--pruner",
        "none",
        "--storage",
        "sqlite:///w.db",
        "--study",
        "w",
        "--json",
        check=True,
    )
    summary = json.loads(proc.stdout)
    assert [w["exit_code"] for w in summary["workers"]] == [0, 0]
    study = optuna.load_study(study_name="w", storage=f"sqlite:///{tmp_path / 'w.db'}")
    trials = study.get_trials(deepcopy=False)
    surplus = [t for t in trials if t.user_attrs.get("surplus")]  # asked past the target: they trained nothing
    assert all(t.state == optuna.trial.TrialState.FAIL and "map_key" not in t.user_attrs for t in surplus)
    finished = [t for t in trials if t.state.is_finished() and t not in surplus]
    assert len(finished) == 7 and summary["n_trials"] == 7, [t.state for t in trials]
    trained = Counter(t.user_attrs["map_key"] for t in finished if "reused_from" not in t.user_attrs)
    assert trained and max(trained.values()) == 1, trained
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    # both workers trained (each registered its own sampling stream), and each reference exists once
    with sqlite3.connect(tmp_path / "w.db") as db:
        workers = db.execute("select count(*) from ilr_runs where kind = 'worker'").fetchone()[0]
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


def test_every_event_crosses_a_process_queue_with_its_worker_and_reaches_the_parents_renderer(capsys):
    """Each kind of event a worker reports is put on the parent's queue as it is, with the worker's number, and
    the one console renderer draws it (lines from a worker say which)."""
    import multiprocessing as mp
    import typing

    from ilr_search.cli.live import ConsoleReporter
    from ilr_search.commands.workers import QueueReporter
    from ilr_search.search import progress

    events = mp.get_context("spawn").Queue()
    sent = QueueReporter(events, worker=3)
    from optuna.trial import TrialState

    from ilr_search.analysis.results import FrontRow
    from ilr_search.storage.trials import TrialRecord

    row = TrialRecord(1, TrialState.COMPLETE, reuse_map=(2, 1, 1), map_key="2,1,1", flops_ratio=1.3, val_ppl=9.5)
    front = [FrontRow(1, (2, 1, 1), "2,1,1", None, 1.3, 9.5, None, None)]
    kinds = [
        progress.StudyStarted("s", 7, 2),
        progress.TrialStarted(4, [2, 1, 1], 16, "injection=add"),
        progress.Step(5, 16, 2.25),
        progress.TrialFinished(row, front, 3),
        progress.ReferenceStarted("block2", 0, 2, 16),
        progress.ReferenceFinished("block2"),
        progress.RunsStarted((("2,1,1", 32, 1), ("1,1,1", 32, 1))),
        progress.RunFinished("2,1,1", 32, 1, 9.1),
        progress.Message("hello"),
    ]
    assert {type(e) for e in kinds} == set(typing.get_args(progress.Event))  # every kind of event
    for event in kinds:
        sent.on(event)
    received = [events.get(timeout=HANG_SECONDS) for _ in kinds]
    assert received == [type(e)(**{**e.__dict__, "worker": 3}) for e in kinds]
    with ConsoleReporter() as reporter:
        for event in received:
            reporter.on(event)
    printed = capsys.readouterr().err
    assert "worker 3: trial 1 complete: map 2,1,1" in printed and "worker 3: hello" in printed
    assert (
        "worker 3: race runs: map 2,1,1 at 32 steps, seed 1; the plain model at 32 steps, seed 1 (fused, 2 at once)"
        in printed
    )
    assert "worker 3: race run done: map 2,1,1 at 32 steps, seed 1: ppl 9.1" in printed
    assert "trial 4" not in printed.split("race runs")[1]  # a race run is never labelled as a trial


@pytest.mark.slow
def test_a_trial_asked_after_its_predecessors_make_n_trials_trains_nothing(tmp_path, monkeypatch, token_cache):
    """Two workers can count the study below its target at the same moment and both ask for a trial: the later
    of the two finds the trials before it already make the target, trains nothing, and is left out of the
    count. Here the second ask is made by hand, once the study has reached its target."""
    from ilr_search.search import RunRequest, run_in_process
    from ilr_search.search.progress import RunReporter
    from ilr_search.search.run import prepare_study
    from ilr_search.search.trial_groups import SearchRun
    from ilr_search.space import load_space
    from ilr_search.storage import open_store
    from ilr_search.storage.trials import TrialAttr

    monkeypatch.chdir(tmp_path)
    space = load_space(
        str(ROOT / "tests" / "spaces" / "tiny.toml"), {"search": {"noise_seeds": 0, "families": ["ilr"]}}
    )
    request = RunRequest(space, "2x", study_name="s", storage="sqlite:///s.db", n_trials=2, race=False)
    assert run_in_process(request).to_json()["n_trials"] == 2
    prepared = prepare_study(request)
    run = SearchRun(
        prepared.plan,
        prepared.study,
        open_store(prepared.spec, prepared.plan.name),
        prepared.data,
        RunReporter(),
        prepared.n_trials,
        tmp_path / "checkpoints",
    )
    run.run_group(1, lambda study, trial: None)
    late = prepared.study.get_trials(deepcopy=False)[-1]
    assert late.state == optuna.trial.TrialState.FAIL and late.user_attrs[TrialAttr.SURPLUS] is True
    assert late.params == {} and "map_key" not in late.user_attrs  # no map was proposed, claimed or trained
    again = run_in_process(request).to_json()
    assert again["n_trials"] == 2 and again["n_failed"] == 0


@pytest.mark.slow
def test_two_workers_each_fusing_their_own_group_train_no_map_twice(cli, tmp_path):
    proc = cli(
        "run",
        *TINY,
        "--budget",
        "2x",
        "--n-trials",
        "9",
        "--workers",
        "2",
        "--fuse",
        "3",
        "--pruner",
        "none",
        "--storage",
        "sqlite:///wf.db",
        "--study",
        "wf",
        "--json",
        check=True,
    )
    summary = json.loads(proc.stdout)
    assert [w["exit_code"] for w in summary["workers"]] == [0, 0]
    trials = optuna.load_study(study_name="wf", storage=f"sqlite:///{tmp_path / 'wf.db'}").get_trials(deepcopy=False)
    surplus = [t for t in trials if t.user_attrs.get("surplus")]  # asked past the target: they trained nothing
    assert all(t.state == optuna.trial.TrialState.FAIL and "map_key" not in t.user_attrs for t in surplus)
    finished = [t for t in trials if t.state.is_finished() and t not in surplus]
    assert len(finished) == 9 and summary["n_trials"] == 9, [t.state for t in trials]
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    trained = Counter(t.user_attrs["map_key"] for t in finished if "reused_from" not in t.user_attrs)
    assert trained and max(trained.values()) == 1, trained
    assert max(t.user_attrs.get("fused_group", 1) for t in finished) > 1  # the workers trained groups fused
    with sqlite3.connect(tmp_path / "wf.db") as db:
        workers = db.execute("select count(*) from ilr_runs where kind = 'worker'").fetchone()[0]
    assert workers >= 3  # two workers and the parent's final pass
    assert {"baseline_seed1", "baseline_seed2", "second_seed"} <= set(summary["references"])
