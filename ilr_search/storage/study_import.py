"""The one-shot import of a study stored before the ledger of runs (ilr-search schema version 1 or 2): its race runs
in a table of their own (ilr_audit in version 1, ilr_race_runs in 2, a frozen run's scores in ilr_run_scores) and
its reference runs in study attributes `ilr:reference:NAME` become runs of the ledger (ilr_runs), and the old tables
and attributes are dropped. A journal's side file keeps the same runs as lines of kind "audit" and its study
attributes: they become lines of kind "race_run" and "reference".

open_store imports a study's storage when it first opens it (import_database, import_journal), and
`ilr-search migrate` does so for every study of a storage; the stores themselves read only the ledger.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import OperationalError, ProgrammingError

from ilr_search.storage.journal_store import flocked, read_records, write_records
from ilr_search.storage.sql_store import SCHEMA_VERSION, race_run_name, retry_locked, runs_table, schema_table
from ilr_search.storage.store import Run, RunJob, reference_run

log = logging.getLogger("ilr_search")

OLD_REFERENCE_PREFIX = "ilr:reference:"  # the study attribute of a reference run before the ledger
OLD_RACE_RUNS = ("ilr_audit", "ilr_race_runs")  # the race runs' table of schema version 1, then 2 (oldest first)
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


def needs_import(engine: sa.Engine) -> bool:
    """Whether the database holds an old race runs' table (what makes it a database before the ledger)."""
    return bool(set(OLD_RACE_RUNS) & set(sa.inspect(engine).get_table_names()))


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
                runs[(r["study"], "race", race_run_name(job))] = r | {"kind": "race", "name": race_run_name(job)}
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
    for name in (*OLD_RACE_RUNS, _old_scores_table.name):
        if name in tables:
            conn.exec_driver_sql(f"DROP TABLE {name}")


@retry_locked
def import_database(engine: sa.Engine) -> bool:
    """Import a database stored before the ledger (schema version 1 or 2); True if this call imported it. One
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
            tables = set(sa.inspect(conn).get_table_names())
            if not set(OLD_RACE_RUNS) & tables:
                return False  # imported by another process meanwhile
            runs_table.create(conn, checkfirst=True)
            _import_rows(conn, tables)
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
    log.info("storage: race and reference runs imported into table %s", runs_table.name)
    return True


def import_journal(side_file: Path, study: str, study_attrs: Mapping[str, Any]) -> bool:
    """Import a journal study's old records into its side file (JournalStore's): lines of kind "audit" become
    "race_run", and where a reference run of the study's attributes has no line of its name, each of them becomes
    one, ahead of the file's lines (a reference stored since then keeps the attribute's place and its own result,
    as they read before). The journal keeps the attributes (it forgets nothing); once imported they are passed
    over. True if this call changed the file."""
    with flocked(str(side_file) + ".lock"):
        lines = read_records(side_file)
        stored = {r["name"] for r in lines if r["study"] == study and r["kind"] == "reference"}
        old = old_references(study_attrs)
        imported = (
            [] if set(old) <= stored else [{"study": study, **r.to_record(), "kind": "reference"} for r in old.values()]
        )
        renamed = [r | {"kind": "race_run"} if r["kind"] == "audit" else r for r in lines]
        if not imported and renamed == lines:
            return False
        part = side_file.with_name(side_file.name + ".import")
        write_records(part, imported + renamed, "w")
        os.replace(part, side_file)
        return True
