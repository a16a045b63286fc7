"""Deterministic tests of the heartbeat and take-over rules: a worker never fails its own trial, a retry does
not inherit a stale heartbeat, and a worker whose trial is failed under it keeps its result (on its map's run)
and goes on."""

import time

import optuna
import pytest
from conftest import ROOT
from optuna.trial import TrialState

from ilr_search.search.progress import Event, RunReporter, Step
from ilr_search.search.run import RunRequest, run_in_process
from ilr_search.search.studies import study_report
from ilr_search.search.trial_groups import WORKER_ATTR, sweep_stale_trials
from ilr_search.space import load_space
from ilr_search.storage import Store, grace_period, heartbeat_interval, open_storage, open_store, parse_storage

SPACE = ROOT / "tests" / "spaces" / "tiny.toml"


def test_grace_period_is_several_intervals():
    assert grace_period() >= 3 * heartbeat_interval()


def test_sweep_spares_fresh_retries_and_the_callers_own_trial(tmp_path):
    spec = parse_storage(f"journal:{tmp_path / 'j.log'}")
    study = optuna.create_study(study_name="s", storage=open_storage(spec), directions=["minimize"])
    store = open_store(spec, "s", storage=study._storage)
    store.register_worker("dead")  # beats once, now: stale a second later
    time.sleep(1.1)
    retry = study.ask()
    # a retry inherits its dead predecessor's system attributes, its worker included
    study._storage.set_trial_system_attr(retry._trial_id, WORKER_ATTR, "dead")
    assert sweep_stale_trials(study, store, stale_after=1.0) == []  # it started just now: not stale
    assert study._storage.get_trial(retry._trial_id).state == TrialState.RUNNING
    mine = study.ask()
    study._storage.set_trial_system_attr(mine._trial_id, WORKER_ATTR, "me")  # never beats
    assert sweep_stale_trials(study, store, worker="me", stale_after=1.0) == []
    time.sleep(1.1)  # both stale now: the caller's own trial is spared
    assert sweep_stale_trials(study, store, worker="me", stale_after=1.0) == [retry.number]


class FailMyTrialAt(RunReporter):
    """Plays another worker's sweep: at a given step of the first trained map, fails this worker's running
    trial and queues its retry, as a sweep that judged it stale would."""

    def __init__(self, study_name: str, storage: str, at_step: int) -> None:
        self.study_name, self.storage, self.at_step = study_name, storage, at_step
        self.done = False

    def on(self, event: Event) -> None:
        if self.done or not isinstance(event, Step) or event.step != self.at_step:
            return
        st = open_storage(parse_storage(self.storage))
        study = optuna.load_study(study_name=self.study_name, storage=st)
        (running,) = study.get_trials(states=(TrialState.RUNNING,))
        st.set_trial_state_values(running._trial_id, state=TrialState.FAIL)
        optuna.storages.RetryHeartbeatStaleTrialCallback()(study, st.get_trial(running._trial_id))
        self.done = True


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_worker_whose_trial_is_failed_under_it_keeps_the_result_and_goes_on(kind, tmp_path, token_cache):
    storage = f"sqlite:///{tmp_path / 's.db'}" if kind == "sqlite" else f"journal:{tmp_path / 's.log'}"
    space = load_space(
        SPACE, {"search": {"noise_seeds": 0, "families": ["ilr"], "enqueue_paper_maps": False}, "train": {"steps": 12}}
    )
    reporter = FailMyTrialAt("t", storage, at_step=6)
    summary = run_in_process(
        RunRequest(
            space, "2x", "t", storage, n_trials=3, sampler="random", pruner="none", checkpoint_dir=tmp_path / "ck"
        ),
        reporter,
    ).to_json()
    assert reporter.done and not summary["interrupted"]
    study = optuna.load_study(study_name="t", storage=open_storage(parse_storage(storage)))
    trials = study.get_trials()
    (failed,) = [t for t in trials if t.state == TrialState.FAIL]
    # its result is on its map's run, under its number: the trial that trained the map is the failed one
    store = open_store(parse_storage(storage), "t")
    (run,) = [r for r in store.runs() if r.kind == "trial" and r.trial == failed.number]
    assert run.state == "complete" and run.map_key == failed.user_attrs["map_key"] and run.val_ppl is not None
    assert sorted(p.step for p in store.curve_points() if p.trial_number == failed.number) == [3, 6, 12]
    (listed,) = [t for t in study_report(study, parse_storage(storage), store).trials if t.number == failed.number]
    assert listed.state == TrialState.COMPLETE and listed.is_trained_result and listed.steps == 12
    # the retry may still wait: one more trial runs it
    run_in_process(
        RunRequest(
            space, "2x", "t", storage, n_trials=4, sampler="random", pruner="none", checkpoint_dir=tmp_path / "ck"
        )
    )
    trials = study.get_trials()
    retry = [t for t in trials if t.system_attrs.get("failed_trial") == failed.number]
    assert retry and retry[0].state == TrialState.COMPLETE and retry[0].user_attrs["reused_from"] == failed.number
    trained = [
        t.user_attrs["map_key"]
        for t in trials
        if t.user_attrs.get("steps", 0) > 0 and t.state.is_finished() and t.state != TrialState.FAIL
    ]
    assert len(trained) == len(set(trained))  # the map was not trained again
    assert not [t for t in trials if t.state == TrialState.RUNNING]


@pytest.mark.slow
def test_a_trial_stopped_between_its_result_on_the_run_and_its_tell_is_not_trained_again(
    tmp_path, token_cache, monkeypatch
):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    space = load_space(
        SPACE, {"search": {"noise_seeds": 0, "families": ["ilr"], "enqueue_paper_maps": False}, "train": {"steps": 6}}
    )
    finish_run = Store.finish_run

    def stop_after_the_result(self, kind, job, worker, state, *args, **kwargs):  # Ctrl-C right after the write
        written = finish_run(self, kind, job, worker, state, *args, **kwargs)
        if kind == "trial" and state == "complete":
            raise KeyboardInterrupt
        return written

    monkeypatch.setattr(Store, "finish_run", stop_after_the_result)
    request = RunRequest(space, "2x", "t", storage, n_trials=1, sampler="random", pruner="none")
    assert run_in_process(request).to_json()["interrupted"]
    monkeypatch.setattr(Store, "finish_run", finish_run)
    study = optuna.load_study(study_name="t", storage=open_storage(parse_storage(storage)))
    stopped, queued = study.get_trials()
    assert stopped.state == TrialState.FAIL  # failed and queued again, as Ctrl-C does, its result on its run
    assert queued.state == TrialState.WAITING
    run_in_process(request)
    retry = study.get_trials()[queued.number]
    assert retry.params == stopped.params and retry.state == TrialState.COMPLETE
    assert retry.user_attrs["reused_from"] == stopped.number and retry.user_attrs["steps"] == 0  # not trained again
    store = open_store(parse_storage(storage), "t")
    (run,) = [r for r in store.runs() if r.kind == "trial"]
    assert run.trial == stopped.number and run.val_ppl == retry.user_attrs["val_ppl"]
    (listed,) = [t for t in study_report(study, parse_storage(storage), store).trials if t.is_trained_result]
    assert listed.number == stopped.number and listed.val_ppl == run.val_ppl
