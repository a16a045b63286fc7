"""One database handle per process: the project's store shares the engine of the Optuna storage opened there."""

import optuna
import pytest
import sqlalchemy as sa
from conftest import NO_REFERENCES, TINY_SPACE

from ilr_search.commands.audit import AuditSettings, run_audit
from ilr_search.commands.report import export_trials, pareto_report
from ilr_search.search import RunRequest, run_in_process
from ilr_search.space import load_space
from ilr_search.storage import JournalStore, SQLStore, open_storage, open_store, parse_storage
from ilr_search.storage.optuna_storage import rdb_engine


@pytest.fixture(params=["sqlite", "postgres"])
def sql_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 's.db'}"
    return request.getfixturevalue("postgres_url")


def test_the_store_shares_the_engine_of_the_optuna_storage(sql_url):
    spec = parse_storage(sql_url)
    storage = open_storage(spec, heartbeat=False)
    study = optuna.create_study(study_name="s", storage=storage)
    for given in (storage, study._storage):  # as opened, and as a Study holds it (in Optuna's cache)
        store = open_store(spec, "s", storage=given)
        assert isinstance(store, SQLStore) and store.engine is storage.engine
    assert store.claim("1,2", 0) == 0 and store.claim("1,2", 1) == 0  # the tables are made on the shared engine
    study.enqueue_trial({"x": 1.0})
    assert study.ask().number == 0  # and Optuna goes on using it
    assert open_store(spec, "s", read_only=True, storage=storage).engine is storage.engine
    own = open_store(spec, "s")  # a store opened alone makes its own engine
    assert own.engine is not storage.engine and own.claim("1,2", 2) == 0


def test_a_journal_store_needs_no_engine(tmp_path):
    spec = parse_storage(f"journal:{tmp_path / 'j.log'}")
    storage = open_storage(spec)
    assert isinstance(open_store(spec, "s", storage=storage), JournalStore)
    with pytest.raises(TypeError, match="no database engine"):
        rdb_engine(storage)


@pytest.mark.slow
def test_run_audit_and_reports_open_no_engine_beside_optunas(tmp_path, token_cache, monkeypatch):
    """Every engine a store uses in run, audit, pareto and export is one an Optuna storage made."""
    optuna_engines, store_engines = [], []
    rdb_init, store_init = optuna.storages.RDBStorage.__init__, SQLStore.__init__

    def recording_rdb_init(self, *args, **kwargs):
        rdb_init(self, *args, **kwargs)
        optuna_engines.append(self.engine)

    def recording_store_init(self, engine, *args, **kwargs):
        store_init(self, engine, *args, **kwargs)
        store_engines.append(engine)

    monkeypatch.setattr(optuna.storages.RDBStorage, "__init__", recording_rdb_init)
    monkeypatch.setattr(SQLStore, "__init__", recording_store_init)
    url = f"sqlite:///{tmp_path / 'w.db'}"
    space = load_space(TINY_SPACE, {"search": NO_REFERENCES, "train": {"steps": 8}})
    run_in_process(
        RunRequest(space, "2x", "w", url, n_trials=2, sampler="random", pruner="none", checkpoint_dir=tmp_path / "ck")
    )
    run_audit("w", url, AuditSettings(factor=1.0, maps="top:1"), checkpoint_dir=tmp_path / "ck")
    pareto_report("w", url)
    export_trials("w", url, tmp_path / "t.csv")
    assert len(store_engines) >= 5  # prepare + run, audit, pareto, export
    assert all(any(e is o for o in optuna_engines) for e in store_engines)
    assert sa.inspect(store_engines[0]).has_table("ilr_map_claims")


@pytest.mark.parametrize("url", ["sqlite", "journal"])
def test_pruning_records_and_fronts_read_back_as_records_on_both_stores(url, tmp_path):
    """What a store keeps of a pruned trial and of a front comes back as typed records, the same on SQL and on a
    journal file."""
    from ilr_search.storage.store import PruningRecord, StoredFrontPoint

    spec = parse_storage(f"sqlite:///{tmp_path / 's.db'}" if url == "sqlite" else f"journal:{tmp_path / 'j.log'}")
    optuna.create_study(study_name="s", storage=open_storage(spec))
    store = open_store(spec, "s")
    store.record_pruning(4, 12, 2.5, 1.25, [0, 2], "dominated at step 12")
    front = [
        {"trial": 0, "reuse_map": [1, 1], "flops_ratio": 1.0, "val_ppl": 20.0, "val_bpb": 4.0, "params": 10},
        {"trial": 3, "reuse_map": [2, 1], "flops_ratio": 1.4, "val_ppl": 19.0, "val_bpb": 3.9, "params": 10},
    ]
    store.save_front(5, front)
    assert store.pruning_records() == {4: PruningRecord(12, 2.5, 1.25, (0, 2), "dominated at step 12")}
    assert store.front_history() == {
        5: [StoredFrontPoint(0, (1, 1), 1.0, 20.0, 4.0, 10), StoredFrontPoint(3, (2, 1), 1.4, 19.0, 3.9, 10)]
    }
