"""The one-shot import of a study stored before the ledger of runs (ilr-search schema version 1 to 4): its race runs
in a table of their own (ilr_audit in version 1, ilr_race_runs in 2, a frozen run's scores in ilr_run_scores) and
its reference runs in study attributes `ilr:reference:NAME` become runs of the ledger (ilr_runs), and the old tables
and attributes are dropped. Its map claims (ilr_map_claims, up to version 3) were held by trials that have all
ended (a study is not shared with workers of an older ilr-search), whose results Optuna keeps: they are dropped,
but the workers' registrations among them (`worker:k`) become runs of kind "worker", so that a resumed study's
next worker samples from a stream of its own. A journal's side file keeps the same runs as lines of kind "audit",
claims as lines of kind "claim", and its study attributes: they become lines of kind "race_run", "worker_run" and
"reference". A study's told trials (up to version 4 their results lived only in Optuna's attributes) have each
its result and number written on its map's run of kind "trial".

open_store imports a study's storage when it first opens it (import_database, import_journal), and
`ilr-search migrate` does so for every study of a storage; the stores themselves read only the ledger.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any, cast

import sqlalchemy as sa
from optuna.trial import TrialState
from sqlalchemy.exc import OperationalError, ProgrammingError

from ilr_search.storage.journal_store import LEDGER_LINE, flocked, read_records, write_records
from ilr_search.storage.sql_store import SCHEMA_VERSION, retry_locked, run_name, runs_table, schema_table
from ilr_search.storage.store import Run, RunJob, claimed_run, reference_run, worker_job
from ilr_search.storage.trials import CONFIG_ATTR, TrialRecord, attrs_record

log = logging.getLogger("ilr_search")

OLD_REFERENCE_PREFIX = "ilr:reference:"  # the study attribute of a reference run before the ledger
OLD_RACE_RUNS = ("ilr_audit", "ilr_race_runs")  # the race runs' table of schema version 1, then 2 (oldest first)
OLD_CLAIMS = "ilr_map_claims"  # the map claims and worker registrations of schema versions 1 to 3
OLD_WORKER_PREFIX = "worker:"  # a worker's registration among the claims: worker:k
# the columns of an old race runs' table (each as ilr_runs has it), after its study
OLD_RUN_COLUMNS = (
    *("factor", "seed", "map_key", "worker", "heartbeat", "state", "flops_ratio", "steps"),
    *("val_loss", "val_ppl", "val_bpb", "curve", "seconds", "reason"),
)

_old_metadata = sa.MetaData()
old_race_runs_tables = {
    name: sa.Table(
        name,
        _old_metadata,
        sa.Column("study", sa.String(512)),
        *(sa.Column(c.name, c.type, nullable=c.nullable) for c in runs_table.columns if c.name in OLD_RUN_COLUMNS),
    )
    for name in OLD_RACE_RUNS
}
_old_claims_table = sa.Table(
    OLD_CLAIMS,
    _old_metadata,
    sa.Column("study", sa.String(512)),
    sa.Column("map_key", sa.String(256)),
    sa.Column("trial_number", sa.Integer),
)
_old_scores_table = sa.Table(
    "ilr_run_scores",
    _old_metadata,
    sa.Column("study", sa.String(512), primary_key=True),
    sa.Column("factor", sa.String(32), primary_key=True),
    sa.Column("seed", sa.Integer, primary_key=True),
    sa.Column("map_key", sa.String(256), primary_key=True),
    sa.Column("scores", sa.Text, nullable=False),
)
# Optuna's tables of studies and their attributes, as far as the import reads them.
_optuna_studies = sa.table("studies", sa.column("study_id"), sa.column("study_name"))
_optuna_study_attrs = sa.table(
    "study_user_attributes",
    sa.column("study_user_attribute_id"),
    sa.column("study_id"),
    sa.column("key"),
    sa.column("value_json"),
)
_optuna_trials = sa.table(
    "trials", sa.column("trial_id"), sa.column("number"), sa.column("study_id"), sa.column("state")
)
_optuna_trial_attrs = sa.table(
    "trial_user_attributes", sa.column("trial_id"), sa.column("key"), sa.column("value_json")
)
OPTUNA_TABLES = {"studies", "study_user_attributes", "trials", "trial_user_attributes"}
TRIAL_RESULT = ("state", "val_loss", "val_ppl", "val_bpb", "seconds", "reason", "trial")  # what a told trial writes
IMPORTED_WORKER = "imported"  # the worker of a run the import wrote


def old_references(study_attrs: Mapping[str, Any]) -> dict[str, Run]:
    """The reference runs a study kept in its attributes ilr:reference:NAME, by name in their stored order."""
    return {
        k[len(OLD_REFERENCE_PREFIX) :]: reference_run(
            k[len(OLD_REFERENCE_PREFIX) :],
            v["schedule"],
            int(v["seed"]),
            float(v["flops_ratio"]),
            v.get("reuse_map"),
            v.get("knobs") or {},
            v.get("map"),
            v.get("val_ppl"),
            v.get("val_bpb"),
            v.get("status"),
            int(v.get("steps", 0)),
            v.get("curve", []),
        )
        for k, v in study_attrs.items()
        if k.startswith(OLD_REFERENCE_PREFIX)
    }


def old_worker(study: str, map_key: str) -> dict[str, Any] | None:
    """The ledger's record of an old claim that registered a worker (`worker:k`): its run of kind "worker", ended
    (its number is never given again); None for a claim of a map."""
    if not map_key.startswith(OLD_WORKER_PREFIX):
        return None
    job = worker_job(int(map_key[len(OLD_WORKER_PREFIX) :]))
    return {"study": study} | claimed_run(job, IMPORTED_WORKER, 0.0, 0.0, 0) | {"state": "complete"}


def needs_import(engine: sa.Engine | sa.Connection) -> bool:
    """Whether the database was stored before this ledger: it holds an old race runs' table or the old claims
    (schema version 1 to 3), or its schema version is older than this one's (4: its trials' results are not in
    their runs)."""
    tables = set(sa.inspect(engine).get_table_names())
    if {*OLD_RACE_RUNS, OLD_CLAIMS} & tables:
        return True
    if schema_table.name not in tables:
        return False
    with engine.connect() if isinstance(engine, sa.Engine) else nullcontext(engine) as conn:
        version = conn.execute(sa.select(schema_table.c.version).where(schema_table.c.id == 1)).scalar()
    return version is not None and version < SCHEMA_VERSION


def trial_run(t: TrialRecord, steps: int, seed: int) -> Run:
    """Trial `t`'s result as the run of its map (kind "trial"): its map at the proxy's length `steps` and the
    space's `seed`; complete, failed (diverged), pruned, or its Optuna state in lower case; its losses where
    complete. Needs its map (a trial that proposed)."""
    assert t.map_key is not None and t.flops_ratio is not None, f"trial {t.number} has no map"
    state = "failed" if t.state == TrialState.FAIL and t.status == "diverged" else t.state.name.lower()
    complete = t.state == TrialState.COMPLETE
    return Run(
        "trial",
        t.map_key,
        "1",
        seed,
        state,
        t.flops_ratio,
        steps,
        val_loss=t.val_loss if complete else None,
        val_ppl=t.val_ppl if complete else None,
        val_bpb=t.val_bpb if complete else None,
        seconds=t.train_seconds,
        reason=t.reason,
        trial=t.number,
    )


def trial_runs(trials: Iterable[TrialRecord], config: Mapping[str, Any]) -> list[Run]:
    """The trial runs of a study stored before its trials wrote their results on their maps' runs: of each map, the
    run of the first trial that trained it to a result (trial_run at the proxy's length and the space's seed of the
    study's stored `config`)."""
    steps, seed = int(config["train"]["steps"]), int(config["train"]["seed"])
    runs: dict[str, Run] = {}
    for t in sorted(trials, key=lambda t: t.number):
        if t.trained_its_map:
            runs.setdefault(cast(str, t.map_key), trial_run(t, steps, seed))
    return list(runs.values())


def _study_trial_runs(conn: sa.Connection, tables: set[str]) -> dict[str, list[Run]]:
    """Of each study made by ilr-search (it has its stored configuration), the trial runs its trials hold
    (trial_runs), read from Optuna's tables."""
    if not OPTUNA_TABLES <= tables:
        return {}
    s, a, t, ta = _optuna_studies.c, _optuna_study_attrs.c, _optuna_trials.c, _optuna_trial_attrs.c
    configs = {
        name: json.loads(value)
        for name, value in conn.execute(
            sa.select(s.study_name, a.value_json)
            .join_from(_optuna_study_attrs, _optuna_studies, a.study_id == s.study_id)
            .where(a.key == CONFIG_ATTR)
        )
    }
    trials: dict[tuple[str, int], tuple[Any, dict[str, Any]]] = {}
    for name, number, state, key, value in conn.execute(
        sa.select(s.study_name, t.number, t.state, ta.key, ta.value_json)
        .join_from(_optuna_trials, _optuna_studies, t.study_id == s.study_id)
        .outerjoin(_optuna_trial_attrs, ta.trial_id == t.trial_id)
    ):
        _, attrs = trials.setdefault((name, number), (state, {}))
        if key is not None:
            attrs[key] = json.loads(value)
    records: dict[str, list[TrialRecord]] = {}
    for (name, number), (state, attrs) in trials.items():
        state = state if isinstance(state, TrialState) else TrialState[str(state)]
        records.setdefault(name, []).append(attrs_record(number, state, attrs))
    return {name: trial_runs(records.get(name, []), config) for name, config in configs.items()}


def _import_trial_rows(conn: sa.Connection, tables: set[str]) -> None:
    """Write each told trial's result to its map's trial run (the run it claimed, or a new one where the study was
    stored before trials claimed runs), with the trial's number."""
    t = runs_table.c
    if "trial" not in {c["name"] for c in sa.inspect(conn).get_columns(runs_table.name)}:
        conn.exec_driver_sql(f"ALTER TABLE {runs_table.name} ADD COLUMN trial INTEGER")
    for study, runs in _study_trial_runs(conn, tables).items():
        for run in runs:
            record = run.to_record() | {"worker": IMPORTED_WORKER, "name": run_name(run.job)}
            where = sa.and_(t.study == study, t.kind == "trial", t.name == record["name"])
            if conn.execute(runs_table.update().where(where).values({k: record[k] for k in TRIAL_RESULT})).rowcount:
                continue
            conn.execute(runs_table.insert().values(study=study, kind="trial", **record))


def _old_race_rows(conn: sa.Connection, table: sa.Table, tables: set[str]) -> list[dict[str, Any]]:
    """The rows of an old race runs' table, each with its scores (JSON text, None where it has none)."""
    c = table.c
    rows = conn.execute(sa.select(table).order_by(c.study, c.factor, c.seed, c.map_key)).mappings().all()
    scores = {}
    if _old_scores_table.name in tables:
        scores = {(r.study, r.factor, r.seed, r.map_key): r.scores for r in conn.execute(sa.select(_old_scores_table))}
    return [dict(r) | {"scores": scores.get((r["study"], r["factor"], r["seed"], r["map_key"]))} for r in rows]


def _import_rows(conn: sa.Connection, tables: set[str]) -> None:
    """Move the race runs of the old tables (the newer table winning where both hold a run) and the reference runs
    of the study attributes into ilr_runs, then drop the old tables and attributes."""
    runs: dict[tuple[str, str, str], dict[str, Any]] = {}
    for name in OLD_RACE_RUNS:
        if name in tables:
            for r in _old_race_rows(conn, old_race_runs_tables[name], tables):
                job = RunJob(r["factor"], r["seed"], r["map_key"])
                runs[(r["study"], "race", run_name(job))] = r | {"kind": "race", "name": run_name(job)}
    if OLD_CLAIMS in tables:
        for study, map_key in conn.execute(sa.select(_old_claims_table.c.study, _old_claims_table.c.map_key)):
            if (worker := old_worker(study, map_key)) is not None:
                name = run_name(RunJob(worker["factor"], worker["seed"], worker["map_key"]))
                runs[(study, "worker", name)] = worker | {"kind": "worker", "name": name}
    if _optuna_study_attrs.name in tables and _optuna_studies.name in tables:
        a, s = _optuna_study_attrs.c, _optuna_studies.c
        attrs = conn.execute(
            sa.select(s.study_name, a.key, a.value_json, a.study_user_attribute_id)
            .join_from(_optuna_study_attrs, _optuna_studies, a.study_id == s.study_id)
            .where(a.key.startswith(OLD_REFERENCE_PREFIX, autoescape=True))
        ).all()
        for study, key, value, _ in attrs:
            run = old_references({key: json.loads(value)})[key[len(OLD_REFERENCE_PREFIX) :]]
            runs[(study, "reference", run.name)] = {"study": study, "kind": "reference"} | run.to_record()
        conn.execute(
            _optuna_study_attrs.delete().where(
                a.study_user_attribute_id.in_([row.study_user_attribute_id for row in attrs])
            )
        )
    t = runs_table.c
    stored = {tuple(r) for r in conn.execute(sa.select(t.study, t.kind, t.name)).all()}
    # every row with every column (one insert of many rows writes the columns of the first)
    new = [{c: r.get(c) for c in t.keys()} for r in runs.values() if (r["study"], r["kind"], r["name"]) not in stored]
    if new:
        conn.execute(runs_table.insert(), new)
    for name in (*OLD_RACE_RUNS, _old_scores_table.name, OLD_CLAIMS):
        if name in tables:
            conn.exec_driver_sql(f"DROP TABLE {name}")


@retry_locked
def import_database(engine: sa.Engine) -> bool:
    """Import a database stored before the ledger (schema version 1 to 4); True if this call imported it. One
    transaction looks and moves: on SQLite it holds the write lock from the start (BEGIN IMMEDIATE), on PostgreSQL
    it locks ilr_schema first, so of two processes opening one old database at once the first imports and the
    second finds it imported. A database of the ledger (or a new one) is left as it is, and no lock is taken."""
    if not needs_import(engine):
        return False
    found = set(sa.inspect(engine).get_table_names())
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "sqlite":
                conn.exec_driver_sql("BEGIN IMMEDIATE")  # the write lock before the look (pysqlite begins lazily)
            elif conn.dialect.name == "postgresql" and schema_table.name in found:
                conn.exec_driver_sql(f"LOCK TABLE {schema_table.name} IN EXCLUSIVE MODE")
            if not needs_import(conn):
                return False  # imported by another process meanwhile
            tables = set(sa.inspect(conn).get_table_names())
            runs_table.create(conn, checkfirst=True)
            _import_rows(conn, tables)
            _import_trial_rows(conn, tables)
            conn.execute(
                schema_table.update()
                .where(schema_table.c.id == 1, schema_table.c.version < SCHEMA_VERSION)
                .values(version=SCHEMA_VERSION)
            )
    except (ProgrammingError, OperationalError):
        # A server: another process imported it while this one waited for its lock (its look came first).
        if not needs_import(engine):
            return False
        raise
    log.info(
        "storage: trials' results, race and reference runs and worker registrations imported into table %s",
        runs_table.name,
    )
    return True


def import_journal(
    side_file: Path, study: str, study_attrs: Mapping[str, Any], trials: Iterable[TrialRecord] = ()
) -> bool:
    """Import a journal study's old records into its side file (JournalStore's): lines of kind "audit" become
    "race_run", lines of kind "claim" that registered a worker become "worker_run" (the other claims are dropped),
    and where a reference run of the study's attributes has no line of its name, each of them becomes
    one, ahead of the file's lines (a reference stored since then keeps the attribute's place and its own result,
    as they read before). The journal keeps the attributes (it forgets nothing); once imported they are passed
    over. A study made by ilr-search (it has its stored configuration) whose `trials` were not imported yet (no
    line of kind "ledger") has each told trial's result written as its map's trial run (trial_runs), then that
    line. True if this call changed the file."""
    with flocked(str(side_file) + ".lock"):
        lines = read_records(side_file)
        stored = {r["name"] for r in lines if r["study"] == study and r["kind"] == "reference"}
        old = old_references(study_attrs)
        imported = (
            [] if set(old) <= stored else [{"study": study, **r.to_record(), "kind": "reference"} for r in old.values()]
        )
        renamed = [
            _imported_line(r) for r in lines if r["kind"] != "claim" or r["map_key"].startswith(OLD_WORKER_PREFIX)
        ]
        told = []
        if CONFIG_ATTR in study_attrs and not any(r["study"] == study and r["kind"] == LEDGER_LINE for r in lines):
            told = [
                {"study": study, **run.to_record(), "kind": "trial_run", "worker": IMPORTED_WORKER}
                for run in trial_runs(trials, study_attrs[CONFIG_ATTR])
            ] + [{"study": study, "kind": LEDGER_LINE}]
        if not imported and not told and renamed == lines:
            return False
        part = side_file.with_name(side_file.name + ".import")
        write_records(part, imported + renamed + told, "w")
        os.replace(part, side_file)
        return True


def _imported_line(line: dict[str, Any]) -> dict[str, Any]:
    """A side file's line as the ledger keeps it: an old race run's (kind "audit") as "race_run", a worker's
    registration (a claim of `worker:k`) as "worker_run", any other as it was."""
    if line["kind"] == "audit":
        return line | {"kind": "race_run"}
    if line["kind"] == "claim":
        worker = old_worker(line["study"], line["map_key"])
        assert worker is not None  # the other claims are dropped
        return worker | {"kind": "worker_run"}
    return line
