"""One test per private Optuna name that ilr_search/storage/optuna_compat.py uses, on real storages: an Optuna
upgrade that moves or changes one fails the test named after it."""

import json

import optuna
import pytest
import sqlalchemy as sa
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from ilr_search.storage import open_storage, parse_storage
from ilr_search.storage import optuna_compat as compat

STORAGES = ["sqlite", "journal"]


def make_study(tmp_path, kind: str) -> optuna.Study:
    url = f"sqlite:///{tmp_path / 'c.db'}" if kind == "sqlite" else f"journal:{tmp_path / 'c.log'}"
    return optuna.create_study(study_name="c", storage=open_storage(parse_storage(url)))


@pytest.mark.parametrize("kind", STORAGES)
def test_study_storage_is_what_the_study_writes_through(tmp_path, kind):
    study = make_study(tmp_path, kind)
    storage = compat.study_storage(study)
    trial = study.ask()
    storage.set_trial_user_attr(compat.trial_id(trial), "seen", 1)
    assert study.trials[0].user_attrs == {"seen": 1}


@pytest.mark.parametrize("kind", STORAGES)
def test_trial_id_of_a_live_and_a_frozen_trial_names_the_same_stored_trial(tmp_path, kind):
    study = make_study(tmp_path, kind)
    study.ask()  # ids and numbers differ once a second study shares the storage; here the trial is the second
    trial = study.ask()
    frozen = study.trials[1]
    assert compat.trial_id(trial) == compat.trial_id(frozen)
    assert compat.study_storage(study).get_trial(compat.trial_id(trial)).number == trial.number == 1


@pytest.mark.parametrize("kind", STORAGES)
def test_study_id_of_a_study_and_its_summary_agree(tmp_path, kind):
    study = make_study(tmp_path, kind)
    summary = next(s for s in optuna.get_all_study_summaries(compat.study_storage(study)) if s.study_name == "c")
    assert compat.study_id(study) == compat.study_id(summary)
    assert compat.study_storage(study).get_study_name_from_id(compat.study_id(study)) == "c"


def test_backend_is_the_rdb_storage_under_optunas_cache(tmp_path):
    study = make_study(tmp_path, "sqlite")
    assert isinstance(compat.backend(compat.study_storage(study)), RDBStorage)
    journal = make_study(tmp_path, "journal")
    assert compat.backend(compat.study_storage(journal)) is compat.study_storage(journal)


def test_trials_table_holds_the_trials_and_their_states(tmp_path):
    study = make_study(tmp_path, "sqlite")
    study.enqueue_trial({"x": 1})
    table = compat.trials_table()
    engine = compat.backend(compat.study_storage(study)).engine
    with engine.connect() as conn:
        rows = conn.execute(sa.select(table.c.trial_id, table.c.state, table.c.datetime_start)).all()
    assert [(r.state, r.datetime_start) for r in rows] == [(TrialState.WAITING, None)]


@pytest.mark.parametrize("kind", STORAGES)
def test_user_attrs_written_at_once_read_back_as_optuna_writes_them(tmp_path, kind):
    study = make_study(tmp_path, kind)
    trial = study.ask()
    attrs = {"reuse_map": [2, 1, 1], "val_ppl": 5.5, "reason": "a", "none": None}
    compat.set_user_attrs_at_once(compat.study_storage(study), compat.trial_id(trial), attrs)
    assert study.trials[0].user_attrs == attrs
    trial.set_user_attr("after", True)  # Optuna's own write beside them
    assert study.trials[0].user_attrs == attrs | {"after": True}
    assert json.loads(json.dumps(study.trials[0].user_attrs)) == attrs | {"after": True}


def test_user_attrs_at_once_are_one_transaction_on_sql(tmp_path):
    study = make_study(tmp_path, "sqlite")
    trial = study.ask()
    engine = compat.backend(compat.study_storage(study)).engine
    commits = []
    sa.event.listen(engine, "commit", lambda conn: commits.append(1))
    compat.set_user_attrs_at_once(compat.study_storage(study), compat.trial_id(trial), {f"k{i}": i for i in range(5)})
    assert len(commits) == 1


def test_remembered_user_attrs_show_on_the_running_trial(tmp_path):
    study = make_study(tmp_path, "sqlite")
    trial = study.ask()
    compat.set_user_attrs_at_once(compat.study_storage(study), compat.trial_id(trial), {"k": 1})
    compat.remember_user_attrs(trial, {"k": 1})
    assert trial.user_attrs == {"k": 1}


def test_no_private_optuna_name_outside_the_shim():
    import re

    from conftest import ROOT

    pattern = re.compile(r"optuna\.(storages\.)?_|\._storage\b|\._trial_id|\._study_id")
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in (ROOT / "ilr_search").rglob("*.py")
        if p.name != "optuna_compat.py"
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []


def test_a_two_objective_tpe_study_proposes_after_pruned_trials_with_intermediate_values():
    """Optuna 5.1's TPE ordered pruned trials by `study.direction`, which a two-objective study has not: with two
    pruned trials that carry intermediate values (what a search stores for the dashboard), its next proposal raised
    RuntimeError (`run --space truth-nope --budget 1.5x` stopped at trial 8). The shim orders them by the first
    objective's direction."""
    assert optuna.samplers._tpe.sampler._get_pruned_trial_score is compat._pruned_trial_score
    study = optuna.create_study(
        directions=["minimize", "minimize"], sampler=optuna.samplers.TPESampler(n_startup_trials=2, seed=0)
    )
    for i, state in enumerate([TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED, TrialState.PRUNED]):
        trial = study.ask()
        trial.suggest_int("r0", 1, 4)
        # as a search stores them (Trial.report refuses a multi-objective trial)
        compat.study_storage(study).set_trial_intermediate_value(compat.trial_id(trial), 10 + i, 3.0 - i * 0.1)
        if state == TrialState.COMPLETE:
            study.tell(trial, [3.0 - i, 1.0 + i])
        else:
            study.tell(trial, state=TrialState.PRUNED)
    trial = study.ask()  # TPE's model now orders the two pruned trials
    assert 1 <= trial.suggest_int("r0", 1, 4) <= 4
    # the deepest first, then the lower loss: the order Optuna gives a single-objective study
    pruned = study.get_trials(states=(TrialState.PRUNED,))
    assert sorted(pruned, key=lambda t: compat._pruned_trial_score(t, study))[0].number == 3
