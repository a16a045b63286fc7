"""The project's tables in the study's SQL database, beside Optuna's (never altered), and `SQLStore` on them.

- ilr_schema: the schema version;
- ilr_curves: every evaluation of every trial;
- ilr_train_curves: every trial's training loss, as window means (added later: an older database gains it
  when it is next opened for writing, and reads without it as no training curves);
- ilr_pruning: why each pruned trial was pruned;
- ilr_fronts: the Pareto front each time a trial completes, keyed by how many completed trials it is
  computed from (its history; the largest key is the current front);
- ilr_runs: every run (Run), one row per (kind, name). Kind "race": the race's longer or extra-seed runs and the
  audit's longer retrainings (`ilr-search audit`, which the race reads as its own), one per (factor, seed, map),
  claimed by the worker that trains it, with its heartbeat, result, learning curve and a frozen run's per-unit
  scores. Kind "trial": a trial's map, claimed by the worker that trains it (the same protocol), with its
  result and the trial's number once told. Kind "worker": a worker's registration, beaten while its trials run.
  Kind "reference": the reference runs, written once each finishes.
  A database stored before it (schema version 1 to 4) is imported once (study_import.py).

Created on first use; every write is one short transaction, safe with several writers.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from ilr_search.errors import UserInputError
from ilr_search.storage.store import (
    CurvePoint,
    PruningRecord,
    Run,
    RunJob,
    RunKind,
    Store,
    StoredFrontPoint,
    TrainCurvePoint,
    claimed_run,
    run_held,
)

log = logging.getLogger("ilr_search")

# 2: ilr_audit renamed ilr_race_runs; 3: race and reference runs in ilr_runs; 4: claims too; 5: trials' results too
SCHEMA_VERSION = 5

metadata = sa.MetaData()

schema_table = sa.Table(
    "ilr_schema",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("version", sa.Integer, nullable=False),
)


def _curve_table(name: str, *values: str) -> sa.Table:
    """A curve of every trial: a row per (study, trial, step), with the trial's map, the float columns `values`
    and the training tokens seen at the step."""
    return sa.Table(
        name,
        metadata,
        sa.Column("study", sa.String(512), primary_key=True),
        sa.Column("trial_number", sa.Integer, primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True),
        sa.Column("map_key", sa.String(256), nullable=False),
        *(sa.Column(v, sa.Float, nullable=False) for v in values),
        sa.Column("tokens", sa.BigInteger, nullable=False),
    )


curves_table = _curve_table("ilr_curves", "flops_ratio", "val_loss")
train_curves_table = _curve_table("ilr_train_curves", "loss")

pruning_table = sa.Table(
    "ilr_pruning",
    metadata,
    sa.Column("study", sa.String(512), primary_key=True),
    sa.Column("trial_number", sa.Integer, primary_key=True),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("val_loss", sa.Float, nullable=False),
    sa.Column("flops_ratio", sa.Float, nullable=False),
    sa.Column("dominated_by", sa.Text, nullable=False),  # JSON list of trial numbers
    sa.Column("reason", sa.Text, nullable=False),
)

fronts_table = sa.Table(
    "ilr_fronts",
    metadata,
    sa.Column("study", sa.String(512), primary_key=True),
    sa.Column("n_complete", sa.Integer, primary_key=True),
    sa.Column("position", sa.Integer, primary_key=True),
    sa.Column("trial_number", sa.Integer, nullable=False),
    sa.Column("reuse_map", sa.String(256), nullable=False),
    sa.Column("flops_ratio", sa.Float, nullable=False),
    sa.Column("val_ppl", sa.Float, nullable=False),
    sa.Column("val_bpb", sa.Float, nullable=True),
    sa.Column("params", sa.BigInteger, nullable=True),
)


runs_table = sa.Table(
    "ilr_runs",
    metadata,
    sa.Column("study", sa.String(512), primary_key=True),
    sa.Column("kind", sa.String(16), primary_key=True),  # race | reference | trial | worker
    sa.Column("name", sa.String(512), primary_key=True),  # a reference's name; a claimed run's job (run_name)
    sa.Column("factor", sa.String(32), nullable=False),
    sa.Column("seed", sa.Integer, nullable=False),
    sa.Column("map_key", sa.String(256), nullable=False),
    sa.Column("worker", sa.String(64), nullable=False),
    sa.Column("heartbeat", sa.Float, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),  # running | complete | failed (diverged) | interrupted
    sa.Column("flops_ratio", sa.Float, nullable=False),
    sa.Column("steps", sa.Integer, nullable=False),
    sa.Column("val_loss", sa.Float, nullable=True),
    sa.Column("val_ppl", sa.Float, nullable=True),
    sa.Column("val_bpb", sa.Float, nullable=True),
    sa.Column("curve", sa.Text, nullable=True),  # JSON [[step, val_loss], ...]
    sa.Column("seconds", sa.Float, nullable=True),
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column("scores", sa.Text, nullable=True),  # JSON [score, ...] in unit order (a frozen run's)
    sa.Column("trial", sa.Integer, nullable=True),  # a trial run's: the trial told with its result
    sa.Column("schedule", sa.Text, nullable=True),  # JSON (a reference's, as its other fields below)
    sa.Column("reuse_map", sa.Text, nullable=True),  # JSON
    sa.Column("knobs", sa.Text, nullable=True),  # JSON
    sa.Column("block_map", sa.String(256), nullable=True),
    sa.Column("status", sa.String(16), nullable=True),
)


def run_name(job: RunJob) -> str:
    """A claimed run's name in ilr_runs: its factor, seed and map."""
    return f"{job.factor}:{job.seed}:{job.map_key}"


LOCK_WAIT_S = 120.0  # total wait for another SQLite writer, the busy timeout of each attempt included


def retry_locked(fn):
    """SQLite answers `database is locked` when another process held the write lock past the busy timeout:
    say so once on stderr and try again, for LOCK_WAIT_S in all (not 60 silent busy timeouts in a row)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start, delay, told = time.monotonic(), 0.05, False
        while True:
            try:
                return fn(*args, **kwargs)
            except OperationalError as e:
                if "locked" not in str(e) or time.monotonic() - start > LOCK_WAIT_S:
                    raise
                if not told:
                    log.warning("storage is locked by another process; waiting up to %.0f s in all", LOCK_WAIT_S)
                    told = True
                time.sleep(delay)
                delay = min(1.0, delay * 2)

    return wrapper


class SQLStore(Store):
    def __init__(self, engine: sa.Engine, study: str, read_only: bool = False) -> None:
        """`read_only`: create nothing (`pareto`, `export`, `trials` only read); a table not there reads empty."""
        self.engine, self.study = engine, study
        if read_only:
            self.tables = set(sa.inspect(engine).get_table_names())
        else:
            ensure_schema(engine)
            self.tables = set(metadata.tables)

    def _replace(self, table: sa.Table, where: Any, rows: list[dict[str, Any]], raced_is_same: bool = False) -> None:
        """In one transaction: delete the study's rows of `table` that `where` picks and insert `rows` (each with
        the study's name added) in their place. `raced_is_same`: where another worker inserted the same keys between
        our delete and insert (PostgreSQL, read committed), its rows are the same as ours, so its insert stands."""
        try:
            with self.engine.begin() as conn:
                conn.execute(table.delete().where(table.c.study == self.study, where))
                if rows:
                    conn.execute(table.insert(), [{"study": self.study, **r} for r in rows])
        except IntegrityError:
            if not raced_is_same:
                raise

    def _rows(self, table: sa.Table, *where: Any, order: Sequence[Any] = ()) -> Sequence[sa.Row]:
        """The study's rows of `table` that `where` picks, ordered by `order`; none where the table is not there
        (a read-only opening of a database made before it)."""
        if table.name not in self.tables:
            return []
        with self.engine.connect() as conn:
            return conn.execute(sa.select(table).where(table.c.study == self.study, *where).order_by(*order)).all()

    @retry_locked
    def add_curve_point(self, point: CurvePoint, tokens: int) -> None:
        c = curves_table.c
        self._replace(
            curves_table,
            sa.and_(c.trial_number == point.trial_number, c.step == point.step),
            [dataclasses.asdict(point) | {"tokens": tokens}],
        )

    @retry_locked
    def holds_records(self) -> bool:
        tables = [
            t
            for t in (curves_table, train_curves_table, pruning_table, fronts_table, runs_table)
            if t.name in self.tables
        ]
        with self.engine.connect() as conn:
            return any(
                conn.execute(sa.select(t.c.study).where(t.c.study == self.study).limit(1)).first() is not None
                for t in tables
            )

    @retry_locked
    def curve_points(self, step: int | None = None) -> list[CurvePoint]:
        c = curves_table.c
        at_step = () if step is None else (c.step == step,)
        rows = self._rows(curves_table, *at_step, order=(c.trial_number, c.step))
        return [CurvePoint(r.trial_number, r.step, r.val_loss, r.flops_ratio, r.map_key, r.tokens) for r in rows]

    @retry_locked
    def add_train_curve(self, points: list[TrainCurvePoint]) -> None:
        if not points:
            return
        c = train_curves_table.c
        steps: dict[int, list[int]] = {}
        for p in points:
            steps.setdefault(p.trial_number, []).append(p.step)
        self._replace(
            train_curves_table,
            sa.or_(*(sa.and_(c.trial_number == n, c.step.in_(at)) for n, at in steps.items())),
            [
                {
                    "trial_number": p.trial_number,
                    "step": p.step,
                    "map_key": p.map_key,
                    "loss": p.loss,
                    "tokens": p.tokens,
                }
                for p in points
            ],
        )

    @retry_locked
    def train_curve_points(self) -> list[TrainCurvePoint]:
        c = train_curves_table.c
        rows = self._rows(train_curves_table, order=(c.trial_number, c.step))
        return [TrainCurvePoint(r.trial_number, r.step, r.tokens, r.loss, r.map_key) for r in rows]

    @retry_locked
    def record_pruning(
        self, trial_number: int, step: int, val_loss: float, flops_ratio: float, dominated_by: list[int], reason: str
    ) -> None:
        self._replace(
            pruning_table,
            pruning_table.c.trial_number == trial_number,
            [
                {
                    "trial_number": trial_number,
                    "step": step,
                    "val_loss": val_loss,
                    "flops_ratio": flops_ratio,
                    "dominated_by": json.dumps(dominated_by),
                    "reason": reason,
                }
            ],
        )

    @retry_locked
    def pruning_records(self) -> dict[int, PruningRecord]:
        return {
            r.trial_number: PruningRecord(
                r.step, r.val_loss, r.flops_ratio, tuple(json.loads(r.dominated_by)), r.reason
            )
            for r in self._rows(pruning_table)
        }

    @retry_locked
    def save_front(self, n_complete: int, front: list[dict[str, Any]]) -> None:
        self._replace(
            fronts_table,
            fronts_table.c.n_complete == n_complete,
            [
                {
                    "n_complete": n_complete,
                    "position": i,
                    "trial_number": p["trial"],
                    "reuse_map": ",".join(map(str, p["reuse_map"])),
                    "flops_ratio": p["flops_ratio"],
                    "val_ppl": p["val_ppl"],
                    "val_bpb": p.get("val_bpb"),
                    "params": p.get("params"),
                }
                for i, p in enumerate(front)
            ],
            raced_is_same=True,  # the same count is the same set of complete trials, so the same front
        )

    @retry_locked
    def front_history(self) -> dict[int, list[StoredFrontPoint]]:
        history: dict[int, list[StoredFrontPoint]] = {}
        for r in self._rows(fronts_table, order=(fronts_table.c.n_complete, fronts_table.c.position)):
            history.setdefault(r.n_complete, []).append(
                StoredFrontPoint(
                    r.trial_number,
                    tuple(int(x) for x in r.reuse_map.split(",")),
                    r.flops_ratio,
                    r.val_ppl,
                    r.val_bpb,
                    r.params,
                )
            )
        return history

    def _run_where(self, kind: RunKind, job: RunJob) -> Any:
        t = runs_table.c
        return sa.and_(t.study == self.study, t.kind == kind, t.name == run_name(job))

    @retry_locked
    def claim_run(
        self, kind: RunKind, job: RunJob, worker: str, flops_ratio: float, steps: int, stale_after: float
    ) -> bool:
        now = time.time()
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    runs_table.insert().values(
                        study=self.study,
                        kind=kind,
                        name=run_name(job),
                        **claimed_run(job, worker, now, flops_ratio, steps),
                    )
                )
            return True
        except IntegrityError:
            pass
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(runs_table).where(self._run_where(kind, job))).mappings().one()
            if run_held(row, worker, now, stale_after):
                return False
            moved = conn.execute(
                runs_table.update()
                .where(
                    self._run_where(kind, job),
                    runs_table.c.worker == row["worker"],
                    runs_table.c.heartbeat == row["heartbeat"],
                )
                .values(worker=worker, heartbeat=now, state="running", steps=steps, flops_ratio=flops_ratio)
            )
            return moved.rowcount == 1

    @retry_locked
    def beat_run(self, kind: RunKind, job: RunJob, worker: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                runs_table.update()
                .where(self._run_where(kind, job), runs_table.c.worker == worker, runs_table.c.state == "running")
                .values(heartbeat=time.time())
            )

    @retry_locked
    def _finish_run(self, kind: RunKind, job: RunJob, worker: str, result: dict[str, Any]) -> bool:
        with self.engine.begin() as conn:
            done = conn.execute(
                runs_table.update()
                .where(self._run_where(kind, job), runs_table.c.worker == worker)
                .values(heartbeat=time.time(), **result)
            )
            return done.rowcount == 1

    @retry_locked
    def save_reference(self, run: Run) -> None:
        t = runs_table.c
        self._replace(
            runs_table,
            sa.and_(t.kind == "reference", t.name == run.name),
            [{"kind": "reference", **run.to_record()}],
            raced_is_same=True,  # a reference is one map at one seed, so the same run
        )

    @retry_locked
    def runs(self) -> list[Run]:
        t = runs_table.c
        by_name = sa.case((t.kind == "reference", t.name), else_="")  # a reference by name, a claimed run by its job
        rows = self._rows(runs_table, order=(t.kind, by_name, t.factor, t.seed, t.map_key))
        return [Run.from_record(dict(r._mapping), r.kind) for r in rows]


def ensure_schema(engine: sa.Engine) -> None:
    """Create the project's tables if missing and check their version; Optuna's tables are not touched."""
    for attempt in range(10):
        try:
            metadata.create_all(engine, checkfirst=True)
            break
        except (IntegrityError, ProgrammingError, OperationalError) as e:
            # Workers starting together race to create the tables (PostgreSQL: duplicate type/table): the
            # other one won; look again. A lock held by another SQLite writer: wait and look again.
            # SQLite says "table ... already exists" when another process created it between check and create.
            raced = isinstance(e, (IntegrityError, ProgrammingError)) or "already exists" in str(e)
            if attempt == 9 or not raced and "locked" not in str(e):
                raise
            time.sleep(0.1 * (attempt + 1))
    with engine.begin() as conn:
        version = conn.execute(sa.select(schema_table.c.version).where(schema_table.c.id == 1)).scalar()
        if version is None:
            try:
                conn.execute(schema_table.insert().values(id=1, version=SCHEMA_VERSION))
            except IntegrityError:  # another process created it first
                pass
        elif version < SCHEMA_VERSION:  # an older database that had nothing to import
            conn.execute(schema_table.update().where(schema_table.c.id == 1).values(version=SCHEMA_VERSION))
        elif version > SCHEMA_VERSION:
            raise UserInputError(
                f"the database's ilr-search schema is version {version}, newer than this "
                f"ilr-search ({SCHEMA_VERSION}); upgrade ilr-search"
            )
