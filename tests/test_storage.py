"""One database handle per process: the project's store shares the engine of the Optuna storage opened there."""

import threading

import optuna
import pytest
import sqlalchemy as sa
from conftest import NO_REFERENCES, TINY_SPACE

from ilr_search.commands.audit import AuditSettings, run_audit
from ilr_search.commands.report import export_trials, pareto_report
from ilr_search.search import RunRequest, run_in_process
from ilr_search.space import load_space
from ilr_search.storage import (
    CurvePoint,
    JournalStore,
    Run,
    RunJob,
    SQLStore,
    open_storage,
    open_store,
    parse_storage,
    reference_run,
    stored_references,
    study_references,
)
from ilr_search.storage.optuna_storage import rdb_engine


@pytest.fixture(params=["sqlite", "postgres"])
def sql_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 's.db'}"
    return request.getfixturevalue("postgres_url")


def test_the_store_shares_the_engine_of_the_optuna_storage(sql_url):
    spec = parse_storage(sql_url)
    storage = open_storage(spec)
    study = optuna.create_study(study_name="s", storage=storage)
    for given in (storage, study._storage):  # as opened, and as a Study holds it (in Optuna's cache)
        store = open_store(spec, "s", storage=given)
        assert isinstance(store, SQLStore) and store.engine is storage.engine
    assert (
        store.register_worker("a") == 0 and store.register_worker("b") == 1
    )  # the tables are made on the shared engine
    study.enqueue_trial({"x": 1.0})
    assert study.ask().number == 0  # and Optuna goes on using it
    assert open_store(spec, "s", read_only=True, storage=storage).engine is storage.engine
    own = open_store(spec, "s")  # a store opened alone makes its own engine
    assert own.engine is not storage.engine and own.register_worker("c") == 2


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
    assert sa.inspect(store_engines[0]).has_table("ilr_runs")


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


def reference(name: str, val_ppl: float, seed: int = 1) -> Run:
    return reference_run(name, [0, 0, 1], seed, 1.5, [2, 1], {}, None, val_ppl, 4.0, "ok", 24, [(12, 4.5), (24, 4.2)])


@pytest.fixture(params=["sqlite", "postgres", "journal"])
def store_url(request, tmp_path):
    if request.param == "journal":
        return f"journal:{tmp_path / 'j.log'}"
    return f"sqlite:///{tmp_path / 's.db'}" if request.param == "sqlite" else request.getfixturevalue("postgres_url")


def test_a_reference_run_is_one_typed_row_replaced_by_name(store_url):
    """A database reads its references by name (as Optuna read a SQLite study's attributes), a journal in the
    order first stored (as Optuna's journal keeps them)."""
    store = open_store(parse_storage(store_url), "s")
    store.claim_run("race", RunJob("2", 0, "2,1"), "w", 1.5, 48, stale_after=60.0)
    store.save_reference(reference("second_seed", 60.0))
    store.save_reference(reference("baseline_seed1", 50.0))
    store.save_reference(reference("second_seed", 58.0, seed=2))  # the best map changed: trained again
    refs = {r.name: r for r in store.reference_runs()}
    in_order = ["second_seed", "baseline_seed1"] if store_url.startswith("journal:") else sorted(refs)
    assert list(refs) == in_order and [(r.val_ppl, r.seed) for r in refs.values()] == [
        (58.0, 2) if name == "second_seed" else (50.0, 1) for name in in_order
    ]
    assert refs["second_seed"] == reference("second_seed", 58.0, seed=2)  # read back as written, field for field
    assert refs["second_seed"].to_dict() == {
        "schedule": [0, 0, 1],
        "seed": 2,
        "flops_ratio": 1.5,
        "reuse_map": [2, 1],
        "val_ppl": 58.0,
        "val_bpb": 4.0,
        "status": "ok",
        "steps": 24,
        "curve": [[12, 4.5], [24, 4.2]],
    }
    assert [r.kind for r in store.race_runs()] == ["race"] and [r.kind for r in store.runs()] == ["race"] + [
        "reference"
    ] * 2
    other = open_store(parse_storage(store_url), "t")
    assert other.reference_runs() == []  # another study's


def test_a_journal_study_imports_its_attribute_references_ahead_of_its_stored_runs(tmp_path):
    """A journal study stored before the ledger keeps its references in its attributes: opening it imports them as
    runs, ahead of the side file's, a stored run of the same name keeping the attribute's place and its own result;
    a second opening imports nothing."""
    spec = parse_storage(f"journal:{tmp_path / 'j.log'}")
    storage = open_storage(spec)
    study = optuna.create_study(study_name="s", storage=storage)
    old = reference("baseline_seed1", 50.0).to_dict()
    for name in ("second_seed", "baseline_seed1"):
        study.set_user_attr(f"ilr:reference:{name}", old)
    stored = reference("second_seed", 58.0)
    JournalStore(str(spec.path), "s").save_reference(stored)
    refs = study_references(spec, study)
    assert list(refs) == ["second_seed", "baseline_seed1"] and refs["second_seed"] == stored
    assert refs["baseline_seed1"].to_dict() == old and refs["baseline_seed1"].kind == "reference"
    assert stored_references(refs.values()) == refs
    side_file = (tmp_path / "j.log.ilr").read_text(encoding="utf-8")
    assert study_references(spec, study) == refs and (tmp_path / "j.log.ilr").read_text(encoding="utf-8") == side_file


def old_database(url: str) -> dict[str, dict]:
    """A database as schema version 2 left it: study s with two reference runs in its attributes, a race run in
    ilr_race_runs (with no ilr_runs table); returns the reference dicts."""
    from ilr_search.storage.sql_store import schema_table
    from ilr_search.storage.study_import import old_race_runs_tables

    study = optuna.create_study(study_name="s", storage=open_storage(parse_storage(url)))
    old = {"baseline_seed1": reference("baseline_seed1", 50.0).to_dict()}
    old["second_seed"] = reference("second_seed", 58.0, seed=2).to_dict() | {"knobs": {"injection": "add"}}
    for name, value in old.items():
        study.set_user_attr(f"ilr:reference:{name}", value)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        table = old_race_runs_tables["ilr_race_runs"]
        table.create(conn)
        schema_table.to_metadata(sa.MetaData()).create(conn)
        conn.execute(sa.text("INSERT INTO ilr_schema (id, version) VALUES (1, 2)"))
        conn.execute(
            table.insert().values(
                study="s", factor="2", seed=0, map_key="2,1", worker="w", heartbeat=1.0, state="complete",
                flops_ratio=1.5, steps=48, val_loss=3.0, val_ppl=20.1, val_bpb=3.5, curve="[[48, 3.0]]",
            )
        )  # fmt: skip
    engine.dispose()
    return old


def test_two_processes_opening_an_older_database_at_once_move_its_runs_once(sql_url):
    """Opening a database of schema version 2 imports its race runs and reference attributes into ilr_runs, once,
    even with two openers at once; the references read as they were stored."""
    old = old_database(sql_url)
    read_only = parse_storage(sql_url, read_only=True)
    ready = threading.Barrier(2)
    opened: list[list[Run]] = []

    def open_for_writing() -> None:
        ready.wait()
        opened.append(open_store(parse_storage(sql_url), "s").runs())  # its own engine: as another process

    threads = [threading.Thread(target=open_for_writing) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(opened) == 2 and opened[0] == opened[1]
    assert [(r.kind, r.name or r.job.map_key) for r in opened[0]] == [
        ("race", "2,1"),
        ("reference", "baseline_seed1"),
        ("reference", "second_seed"),
    ]
    study = optuna.load_study(study_name="s", storage=open_storage(read_only))
    assert not any(k.startswith("ilr:reference:") for k in study.user_attrs)  # moved, not copied
    assert {name: r.to_dict() for name, r in study_references(read_only, study).items()} == old
    engine = sa.create_engine(sql_url)
    names = set(sa.inspect(engine).get_table_names())
    with engine.connect() as conn:
        version = conn.execute(sa.text("SELECT version FROM ilr_schema")).scalar_one()
        count = conn.execute(sa.text("SELECT count(*) FROM ilr_runs")).scalar_one()
    engine.dispose()
    assert {"ilr_race_runs", "ilr_map_claims"}.isdisjoint(names) and version == 5 and count == 3


def _study_of_two_told_trials(storage: optuna.storages.BaseStorage) -> None:
    """A study of ilr-search (its stored configuration: the proxy's 8 steps at seed 3) with two complete trials."""
    study = optuna.create_study(study_name="s", storage=storage)
    study.set_user_attr("ilr:config", {"train": {"steps": 8, "seed": 3}})
    told = {"map_key": "2,1", "reuse_map": [2, 1], "flops_ratio": 1.5, "status": "ok", "val_loss": 4.0, "val_ppl": 54.6}
    study.add_trial(optuna.trial.create_trial(value=54.6, user_attrs=told | {"train_seconds": 2.0}))
    study.add_trial(optuna.trial.create_trial(value=60.0, user_attrs=told | {"map_key": "1,2", "reuse_map": [1, 2]}))


def test_a_schema_4_database_writes_its_told_trials_on_their_runs_once(sql_url):
    """A database of schema version 4 holds its trials' runs without their numbers, or no run where a trial was
    told before runs were claimed: on first open each told trial's result is written on its map's run, with the
    trial's number."""
    storage = open_storage(parse_storage(sql_url))
    _study_of_two_told_trials(storage)
    store = open_store(parse_storage(sql_url), "s", storage=storage)
    job = RunJob("1", 3, "2,1")
    assert store.claim_run("trial", job, "w", 1.5, 8, 60.0)  # as version 4 claimed and finished it, no number
    store.finish_run("trial", job, "w", "complete", 4.0, 54.6, None, (), 2.0, None)
    with rdb_engine(storage).begin() as conn:
        conn.execute(sa.text("ALTER TABLE ilr_runs DROP COLUMN trial"))
        conn.execute(sa.text("UPDATE ilr_schema SET version = 4"))
    expected = [(0, "2,1", "complete", 54.6, 2.0, "w"), (1, "1,2", "complete", 54.6, None, "imported")]
    for _ in range(2):  # imported by the first opening, read as they are by the second
        runs = open_store(parse_storage(sql_url), "s").runs()
        assert [(r.trial, r.map_key, r.state, r.val_ppl, r.seconds, r.worker) for r in runs if r.kind == "trial"] == [
            expected[1],
            expected[0],
        ]


def test_a_journal_study_writes_its_told_trials_on_their_runs_once(tmp_path):
    spec = parse_storage(f"journal:{tmp_path / 'j.log'}")
    storage = open_storage(spec)
    _study_of_two_told_trials(storage)
    first = [r for r in open_store(spec, "s", storage=storage).runs() if r.kind == "trial"]
    assert [(r.trial, r.map_key, r.steps, r.seed, r.state, r.val_ppl) for r in first] == [
        (1, "1,2", 8, 3, "complete", 54.6),
        (0, "2,1", 8, 3, "complete", 54.6),
    ]
    lines = (tmp_path / "j.log.ilr").read_text()
    assert open_store(spec, "s", storage=storage).runs() == first and (tmp_path / "j.log.ilr").read_text() == lines


def test_a_journal_side_file_keeps_the_latest_line_of_each_run_not_every_heartbeat(tmp_path):
    """Heartbeats append a run's line again; once the superseded lines number compact_after and half the file, the
    file is rewritten with each run's latest line. Every reader (this store, another worker's, a fresh one) reads
    the same runs as before, lines of other kinds stay, and the runs go on being beaten, finished and claimed."""
    path = tmp_path / "j.log"
    store, other = JournalStore(str(path), "s"), JournalStore(str(path), "s")
    store.compact_after = other.compact_after = 20
    race, worker = RunJob("4", 1, "2,1,1,1"), RunJob("1", 0, "w")
    assert store.claim_run("race", race, "w1", 1.25, 100, stale_after=60)
    assert store.claim_run("worker", worker, "w1", 0.0, 0, stale_after=60)
    assert other.claim_run("race", RunJob("4", 2, "2,1,1,1"), "w2", 1.25, 100, stale_after=60)
    store.save_reference(reference("plain", 20.0))
    store.add_curve_point(CurvePoint(0, 12, 3.0, 1.0, "1,1,1,1"), 768)
    most = 0
    for _ in range(100):
        store.beat_run("race", race, "w1")
        store.beat_run("worker", worker, "w1")
        other.beat_run("race", RunJob("4", 2, "2,1,1,1"), "w2")
        most = max(most, len(path.with_name("j.log.ilr").read_text().splitlines()))
    assert most <= 2 * 20 + 5 + 1  # without it: 305 lines
    runs = store.runs()
    assert runs == other.runs() == JournalStore(str(path), "s").runs()
    assert [(r.kind, r.seed, r.worker, r.state) for r in runs] == [
        ("race", 1, "w1", "running"),
        ("race", 2, "w2", "running"),
        ("reference", 1, "", "complete"),
        ("worker", 0, "w1", "running"),
    ]
    assert not other.claim_run("race", race, "w2", 1.25, 100, stale_after=60)  # still held by w1's fresh beat
    assert store.finish_run("race", race, "w1", "complete", 3.0, 20.1, 1.3, [(100, 3.0)], 5.0, "")
    assert [r.state for r in store.runs() if r.kind == "race"] == ["complete", "running"]
    assert store.curve_points() == other.curve_points() == [CurvePoint(0, 12, 3.0, 1.0, "1,1,1,1", 768)]
