"""TrialRecord: a trial's attributes read once, under the names the objective writes them with; the filters that
choose the trials a front, a ranking or a table is made of."""

import dataclasses
import shutil
import sqlite3

import optuna
import pytest
from conftest import NO_REFERENCES, TINY_SPACE
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from ilr_search.analysis.results import study_front, trained_by_map, trained_trials
from ilr_search.storage import open_store, parse_storage
from ilr_search.storage.store import Run
from ilr_search.storage.trials import (
    TrialAttr,
    TrialRecord,
    study_trials,
    told_trials,
    trained_results,
    trial_record,
)

# The record's field for each attribute the objective writes (the field is named as the attribute but for the
# parameter count, since `params` is Optuna's own field).
FIELD = {name: name for key, name in vars(TrialAttr).items() if key.isupper()} | {TrialAttr.PARAMS: "param_count"}
SEQUENCES = (TrialAttr.REUSE_MAP, TrialAttr.PROPOSED_MAP)  # stored as lists, read as tuples


def attribute_names() -> set[str]:
    return set(FIELD)


def test_every_attribute_has_its_field():
    fields = {f.name for f in dataclasses.fields(TrialRecord)}
    assert attribute_names() and {FIELD[a] for a in attribute_names()} <= fields


@pytest.fixture(scope="module")
def records_storage(tmp_path_factory, token_cache) -> str:
    """The storage of a real study of today's objective with a searched knob (3 trained trials), resumed with
    trial 0's parameters queued again, so that its fourth trial reuses trial 0's result."""
    from ilr_search.search import RunRequest, run_in_process
    from ilr_search.space import load_space

    folder = tmp_path_factory.mktemp("records")
    storage = f"sqlite:///{folder / 'r.db'}"
    space = load_space(
        TINY_SPACE,
        {"search": {**NO_REFERENCES, "enqueue_paper_maps": False, "knobs": ["injection"]}, "train": {"steps": 8}},
    )
    run = dict(pruner="none", race=False, checkpoint_dir=folder / "checkpoints")
    run_in_process(RunRequest(space, "2x", "records", storage, n_trials=3, **run))
    study = optuna.load_study(study_name="records", storage=storage)
    study.enqueue_trial(study.trials[0].params)
    run_in_process(RunRequest(space, "2x", "records", storage, n_trials=4, **run))
    return storage


@pytest.fixture(scope="module")
def objective_study(records_storage):
    """The study of records_storage."""
    return optuna.load_study(study_name="records", storage=records_storage)


@pytest.mark.slow
def test_a_record_reads_every_attribute_the_objective_writes(objective_study):
    trials = objective_study.trials
    assert len(trials) == 4 and all(t.state == TrialState.COMPLETE for t in trials)
    records = told_trials(objective_study)
    assert records == [trial_record(t) for t in trials]  # the study's records, in its trials' order
    for t, r in zip(trials, records, strict=True):
        assert set(t.user_attrs) <= attribute_names(), set(t.user_attrs) - attribute_names()  # none goes unread
        assert (r.number, r.state, r.params, r.values) == (t.number, t.state, t.params, t.values)
        for name, value in t.user_attrs.items():
            assert getattr(r, FIELD[name]) == (tuple(value) if name in SEQUENCES else value), name
        assert r.seconds == (t.datetime_complete - t.datetime_start).total_seconds()
    trained = records[:3]
    assert all(r.knobs and "injection" in r.knobs for r in trained)  # the searched knob is stored with each map
    assert all(r.steps == 8 and r.status == "ok" and r.val_ppl > 1 and r.is_trained_result for r in trained)


@pytest.mark.slow
def test_a_reused_result_is_read_as_one_and_filtered_out(objective_study):
    records = told_trials(objective_study)
    first, reuse = records[0], records[3]
    assert reuse.reused_from == first.number and reuse.is_reuse and reuse.steps == 0
    assert (reuse.map_key, reuse.val_ppl, reuse.val_loss, reuse.status) == (
        first.map_key,
        first.val_ppl,
        first.val_loss,
        first.status,
    )
    assert reuse.has_result and not reuse.trained_its_map and not reuse.is_trained_result
    assert [r.number for r in trained_results(records)] == [0, 1, 2]
    assert trained_by_map(records)[first.map_key].number == first.number
    assert {p.trial for p in study_front(records)} <= {0, 1, 2} and study_front(records)  # trained results only


def made(number: int, state: TrialState, **attrs) -> optuna.trial.FrozenTrial:
    """A hand-made trial of map 2,1,1,1 (unless `attrs` says otherwise), numbered `number`."""
    values = {"value": attrs.get("val_ppl") or 1.0} if state == TrialState.COMPLETE else {}
    t = create_trial(
        state=state,
        params={"r0": 2},
        distributions={"r0": IntDistribution(1, 3)},
        user_attrs={"map_key": "2,1,1,1", "reuse_map": [2, 1, 1, 1], "flops_ratio": 1.2} | attrs,
        **values,
    )
    t.number = number
    return t


def test_the_filters_on_hand_made_trials():
    frozen = [
        made(0, TrialState.COMPLETE, val_ppl=50.0),  # trained, complete: the only trained result
        made(1, TrialState.COMPLETE, val_ppl=50.0, reused_from=0),  # a reuse
        made(2, TrialState.PRUNED, val_ppl=70.0, map_key="3,1,1,1", pruned_at_step=6),
        made(3, TrialState.FAIL, status="diverged", map_key="3,3,1,1"),  # a result: the map diverges
        made(4, TrialState.FAIL, map_key="1,2,1,1"),  # interrupted: no result
        made(5, TrialState.COMPLETE, map_key="1,1,1,2", val_ppl=None),  # no perplexity
        made(6, TrialState.COMPLETE, val_ppl=49.0),  # map 2,1,1,1 trained a second time
        made(7, TrialState.RUNNING, map_key="1,1,2,1"),
    ]
    trials = [trial_record(t) for t in frozen]
    assert [t.number for t in trained_results(trials)] == [0, 6]
    assert [t.number for t in trials if t.has_result] == [0, 1, 2, 3, 5, 6]
    assert [t.number for t in trained_trials(trials)] == [0, 2, 3, 5, 6]
    assert {k: r.number for k, r in trained_by_map(trials).items()} == {
        "2,1,1,1": 0,
        "3,1,1,1": 2,
        "3,3,1,1": 3,
        "1,1,1,2": 5,
    }
    study = optuna.create_study()
    study.add_trials(frozen)
    assert told_trials(study) == trials  # a study's trials read through the storage as the same records
    assert study_trials(study, []) == trials  # with no run holding a result, the same


def test_a_trial_without_attributes_reads_as_defaults():
    bare = create_trial(state=TrialState.COMPLETE, value=1.0)
    r = trial_record(bare)
    assert (r.reuse_map, r.map_key, r.flops_ratio, r.val_ppl, r.reused_from, r.pruned_at_step) == (None,) * 6
    assert (r.steps, r.steps_saved, dict(r.knobs)) == (0, 0, {})
    assert not r.trained_its_map and not r.is_trained_result and study_front([r]) == []


def study_of(*frozen: optuna.trial.FrozenTrial) -> optuna.Study:
    """An in-memory study of the hand-made trials `frozen`, numbered in their order."""
    study = optuna.create_study()
    study.add_trials(frozen)
    return study


def test_a_trial_failed_under_its_worker_has_the_result_its_maps_run_holds():
    failed = made(0, TrialState.FAIL)  # failed by a sweep once its result was on its map's run
    retry = made(1, TrialState.COMPLETE, val_ppl=50.0, reused_from=0)
    run = Run("trial", "2,1,1,1", "1", 0, "complete", 1.2, 12, val_loss=3.9, val_ppl=50.0, seconds=2.0, trial=0)
    study = study_of(failed, retry)
    trials = study_trials(study, [run])
    assert trials[1] == told_trials(study)[1] and trials[0].is_trained_result and trials[0].state == TrialState.COMPLETE
    assert (trials[0].val_ppl, trials[0].steps, trials[0].train_seconds) == (50.0, 12, 2.0)
    assert [t.number for t in trained_results(trials)] == [0] and trained_by_map(trials)["2,1,1,1"].number == 0
    assert told_trials(study)[0].state == TrialState.FAIL  # as Optuna was told: what the search schedules by
    pruned = dataclasses.replace(run, state="pruned", val_loss=None, val_ppl=None)
    (as_pruned,) = study_trials(study_of(failed), [pruned])
    assert as_pruned.state == TrialState.PRUNED and as_pruned.has_result and not as_pruned.is_trained_result
    (as_diverged,) = study_trials(study_of(failed), [dataclasses.replace(pruned, state="failed")])
    assert as_diverged.status == "diverged" and as_diverged.has_result
    told_later = made(0, TrialState.RUNNING)  # its result on the run, the trial not yet told
    assert study_trials(study_of(told_later), [run])[0].is_trained_result
    running = dataclasses.replace(run, state="running")  # a run still held: no result to read
    assert study_trials(study_of(failed), [running]) == told_trials(study_of(failed))


@pytest.mark.slow
def test_the_readers_read_a_trial_failed_under_its_worker_with_its_runs_result(records_storage, tmp_path):
    """Trial 1 of a copy of the study is failed under its worker after its result was on its map's run: the
    figure draws it as a complete trial, a bench table has its row and the audit reads its proxy result, as every
    report does."""
    from ilr_search.analysis.plots import LEGEND
    from ilr_search.commands.audit import AuditSettings, run_audit
    from ilr_search.commands.bench.table import table_rows
    from ilr_search.commands.report import front_figure

    db = tmp_path / "f.db"
    shutil.copy(records_storage.removeprefix("sqlite:///"), db)
    url = f"sqlite:///{db}"
    with sqlite3.connect(db) as conn:
        (trial_id,) = conn.execute("SELECT trial_id FROM trials WHERE number = 1").fetchone()
        conn.execute("UPDATE trials SET state = 'FAIL' WHERE trial_id = ?", (trial_id,))
        conn.execute("DELETE FROM trial_values WHERE trial_id = ?", (trial_id,))
    study = optuna.load_study(study_name="records", storage=url)
    told = told_trials(study)[1]
    assert told.state == TrialState.FAIL and not told.has_result  # as Optuna holds it
    (run,) = [r for r in open_store(parse_storage(url), "records", read_only=True).runs() if r.trial == 1]
    assert run.state == "complete" and run.val_ppl == told.val_ppl  # its result, on its map's run

    complete = next(t for t in front_figure("records", url).data if t.name == LEGEND["COMPLETE"])
    drawn = dict(zip([h.split(" ")[1] for h in complete.hovertext], complete.y, strict=True))
    assert drawn["1"] == run.val_ppl  # drawn among the complete trials, at its perplexity

    (row,) = [r for r in table_rows("records", url, 8) if r["trial"] == 1]
    assert (row["val_ppl"], row["train_seconds"]) == (run.val_ppl, run.seconds)

    audit = run_audit("records", url, AuditSettings(factor=2, seeds=1, maps="all"), checkpoint_dir=tmp_path / "ck")
    (audited,) = [m for m in audit.report.maps if m.reuse_map == told.map_key]
    assert (audited.proxy_state, audited.proxy_ppl) == ("COMPLETE", run.val_ppl)
