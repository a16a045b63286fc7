"""The project's tables in the study's SQL database, beside Optuna's (which are never altered), and `SQLStore`
on them.

- ilr_schema: the schema version;
- ilr_map_claims: which trial trains which reuse map;
- ilr_curves: every evaluation of every trial;
- ilr_train_curves: every trial's training loss, as window means (added later: an older database gains it
  when it is next opened for writing, and reads without it as no training curves);
- ilr_pruning: why each pruned trial was pruned;
- ilr_fronts: the Pareto front each time a trial completes, keyed by how many completed trials it is
  computed from (its history; the largest key is the current front);
- ilr_run_scores: a frozen race run's score of each window or item of its chunk;
- ilr_race_runs: the race runs, every run beyond the trials and references (the race's longer or extra-seed
  runs, and the audit's longer retrainings, `ilr-search audit`, which the race reads as its own): one row per
  (factor, seed, map), claimed by the worker that trains it, with its heartbeat, result and learning curve.
  Schema version 1 called it ilr_audit: opening an older database for writing renames it (migrate_schema),
  and a read-only opening reads the old name.

Created on first use; every write is one short transaction, safe with several writers.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from ilr_search.errors import UserInputError
from ilr_search.storage.store import (
    CurvePoint,
    PruningRecord,
    RaceRun,
    RaceRunJob,
    Store,
    StoredFrontPoint,
    TrainCurvePoint,
)

log = logging.getLogger("ilr_search")

SCHEMA_VERSION = 2  # 2: ilr_audit renamed ilr_race_runs

metadata = sa.MetaData()

schema_table = sa.Table(
    "ilr_schema",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("version", sa.Integer, nullable=False),
)

claims_table = sa.Table(
    "ilr_map_claims",
    metadata,
    sa.Column("study", sa.String(512), primary_key=True),
    sa.Column("map_key", sa.String(256), primary_key=True),
    sa.Column("trial_number", sa.Integer, nullable=False),
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


race_runs_table = sa.Table(
    "ilr_race_runs",
    metadata,
    sa.Column("study", sa.String(512), primary_key=True),
    sa.Column("factor", sa.String(32), primary_key=True),
    sa.Column("seed", sa.Integer, primary_key=True),
    sa.Column("map_key", sa.String(256), primary_key=True),
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
)

# A frozen run's per-unit scores (what the race pairs by item), one row a race run that has them; added after
# ilr_race_runs, as a table of its own so that an older database gains it on its next opening for writing with no
# change to its rows, and reads without it as runs with no scores.
run_scores_table = sa.Table(
    "ilr_run_scores",
    metadata,
    sa.Column("study", sa.String(512), primary_key=True),
    sa.Column("factor", sa.String(32), primary_key=True),
    sa.Column("seed", sa.Integer, primary_key=True),
    sa.Column("map_key", sa.String(256), primary_key=True),
    sa.Column("scores", sa.Text, nullable=False),  # JSON [score, ...] in unit order
)

LEGACY_RACE_RUNS = "ilr_audit"  # the race runs' table in schema version 1
# The same columns under the old name, for reading a version-1 database opened read-only (never created).
legacy_race_runs_table = race_runs_table.to_metadata(sa.MetaData(), name=LEGACY_RACE_RUNS)


LOCK_WAIT_S = 120.0  # total wait for another SQLite writer, the busy timeout of each attempt included


def _retry_locked(fn):
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
        # A version-1 database read without migrating keeps its race runs under the old name.
        legacy = race_runs_table.name not in self.tables and LEGACY_RACE_RUNS in self.tables
        self.runs = legacy_race_runs_table if legacy else race_runs_table

    @_retry_locked
    def claim(self, map_key: str, trial_number: int) -> int:
        try:
            with self.engine.begin() as conn:
                conn.execute(claims_table.insert().values(study=self.study, map_key=map_key, trial_number=trial_number))
            return trial_number
        except IntegrityError:
            with self.engine.connect() as conn:
                return conn.execute(
                    sa.select(claims_table.c.trial_number).where(
                        claims_table.c.study == self.study, claims_table.c.map_key == map_key
                    )
                ).scalar_one()

    @_retry_locked
    def take_over(self, map_key: str, old_holder: int, trial_number: int) -> bool:
        with self.engine.begin() as conn:
            moved = conn.execute(
                claims_table.update()
                .where(
                    claims_table.c.study == self.study,
                    claims_table.c.map_key == map_key,
                    claims_table.c.trial_number == old_holder,
                )
                .values(trial_number=trial_number)
            )
            return moved.rowcount == 1

    @_retry_locked
    def add_curve_point(self, point: CurvePoint, tokens: int) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                curves_table.delete().where(
                    curves_table.c.study == self.study,
                    curves_table.c.trial_number == point.trial_number,
                    curves_table.c.step == point.step,
                )
            )
            conn.execute(
                curves_table.insert().values(
                    study=self.study,
                    trial_number=point.trial_number,
                    step=point.step,
                    map_key=point.map_key,
                    flops_ratio=point.flops_ratio,
                    val_loss=point.val_loss,
                    tokens=tokens,
                )
            )

    @_retry_locked
    def holds_records(self) -> bool:
        tables = [
            t
            for t in (claims_table, curves_table, train_curves_table, pruning_table, fronts_table, self.runs)
            if t.name in self.tables
        ]
        with self.engine.connect() as conn:
            return any(
                conn.execute(sa.select(t.c.study).where(t.c.study == self.study).limit(1)).first() is not None
                for t in tables
            )

    @_retry_locked
    def curve_points(self, step: int | None = None) -> list[CurvePoint]:
        if curves_table.name not in self.tables:
            return []
        query = sa.select(curves_table).where(curves_table.c.study == self.study)
        if step is not None:
            query = query.where(curves_table.c.step == step)
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(curves_table.c.trial_number, curves_table.c.step)).all()
        return [CurvePoint(r.trial_number, r.step, r.val_loss, r.flops_ratio, r.map_key, r.tokens) for r in rows]

    @_retry_locked
    def add_train_curve(self, points: list[TrainCurvePoint]) -> None:
        if not points:
            return
        with self.engine.begin() as conn:
            for trial_number in {p.trial_number for p in points}:
                conn.execute(
                    train_curves_table.delete().where(
                        train_curves_table.c.study == self.study,
                        train_curves_table.c.trial_number == trial_number,
                        train_curves_table.c.step.in_([p.step for p in points if p.trial_number == trial_number]),
                    )
                )
            conn.execute(
                train_curves_table.insert(),
                [
                    {
                        "study": self.study,
                        "trial_number": p.trial_number,
                        "step": p.step,
                        "map_key": p.map_key,
                        "loss": p.loss,
                        "tokens": p.tokens,
                    }
                    for p in points
                ],
            )

    @_retry_locked
    def train_curve_points(self) -> list[TrainCurvePoint]:
        if train_curves_table.name not in self.tables:
            return []
        query = sa.select(train_curves_table).where(train_curves_table.c.study == self.study)
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(train_curves_table.c.trial_number, train_curves_table.c.step)).all()
        return [TrainCurvePoint(r.trial_number, r.step, r.tokens, r.loss, r.map_key) for r in rows]

    @_retry_locked
    def record_pruning(
        self, trial_number: int, step: int, val_loss: float, flops_ratio: float, dominated_by: list[int], reason: str
    ) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                pruning_table.delete().where(
                    pruning_table.c.study == self.study, pruning_table.c.trial_number == trial_number
                )
            )
            conn.execute(
                pruning_table.insert().values(
                    study=self.study,
                    trial_number=trial_number,
                    step=step,
                    val_loss=val_loss,
                    flops_ratio=flops_ratio,
                    dominated_by=json.dumps(dominated_by),
                    reason=reason,
                )
            )

    @_retry_locked
    def pruning_records(self) -> dict[int, PruningRecord]:
        if pruning_table.name not in self.tables:
            return {}
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(pruning_table).where(pruning_table.c.study == self.study)).all()
        return {
            r.trial_number: PruningRecord(
                r.step, r.val_loss, r.flops_ratio, tuple(json.loads(r.dominated_by)), r.reason
            )
            for r in rows
        }

    @_retry_locked
    def save_front(self, n_complete: int, front: list[dict[str, Any]]) -> None:
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    fronts_table.delete().where(
                        fronts_table.c.study == self.study, fronts_table.c.n_complete == n_complete
                    )
                )
                if front:
                    conn.execute(
                        fronts_table.insert(),
                        [
                            {
                                "study": self.study,
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
                    )
        except IntegrityError:
            # Another worker saved this count's front between our delete and insert (PostgreSQL, read
            # committed). The same count is the same set of complete trials, so its front is ours: done.
            pass

    @_retry_locked
    def front_history(self) -> dict[int, list[StoredFrontPoint]]:
        if fronts_table.name not in self.tables:
            return {}
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(fronts_table)
                .where(fronts_table.c.study == self.study)
                .order_by(fronts_table.c.n_complete, fronts_table.c.position)
            ).all()
        history: dict[int, list[StoredFrontPoint]] = {}
        for r in rows:
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

    def _race_run_where(self, job: RaceRunJob) -> Any:
        t = self.runs.c
        return sa.and_(t.study == self.study, t.factor == job.factor, t.seed == job.seed, t.map_key == job.map_key)

    @_retry_locked
    def claim_race_run(self, job: RaceRunJob, worker: str, flops_ratio: float, steps: int, stale_after: float) -> bool:
        now = time.time()
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    self.runs.insert().values(
                        study=self.study,
                        factor=job.factor,
                        seed=job.seed,
                        map_key=job.map_key,
                        worker=worker,
                        heartbeat=now,
                        state="running",
                        flops_ratio=flops_ratio,
                        steps=steps,
                    )
                )
            return True
        except IntegrityError:
            pass
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(self.runs).where(self._race_run_where(job))).mappings().one()
            if row["state"] in ("complete", "failed") or (
                row["state"] == "running" and row["worker"] != worker and now - row["heartbeat"] <= stale_after
            ):
                return False
            moved = conn.execute(
                self.runs.update()
                .where(
                    self._race_run_where(job),
                    self.runs.c.worker == row["worker"],
                    self.runs.c.heartbeat == row["heartbeat"],
                )
                .values(worker=worker, heartbeat=now, state="running", steps=steps, flops_ratio=flops_ratio)
            )
            return moved.rowcount == 1

    @_retry_locked
    def beat_race_run(self, job: RaceRunJob, worker: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                self.runs.update()
                .where(self._race_run_where(job), self.runs.c.worker == worker, self.runs.c.state == "running")
                .values(heartbeat=time.time())
            )

    @_retry_locked
    def _finish_race_run(self, job: RaceRunJob, worker: str, result: dict[str, Any]) -> bool:
        row = dict(result)
        scores = row.pop("scores", None)
        with self.engine.begin() as conn:
            done = conn.execute(
                self.runs.update()
                .where(self._race_run_where(job), self.runs.c.worker == worker)
                .values(heartbeat=time.time(), **row)
            )
            if done.rowcount == 1 and scores is not None:
                where = run_scores_table.c
                conn.execute(
                    run_scores_table.delete().where(
                        where.study == self.study,
                        where.factor == job.factor,
                        where.seed == job.seed,
                        where.map_key == job.map_key,
                    )
                )
                conn.execute(
                    run_scores_table.insert().values(
                        study=self.study, factor=job.factor, seed=job.seed, map_key=job.map_key, scores=scores
                    )
                )
            return done.rowcount == 1

    @_retry_locked
    def race_runs(self) -> list[RaceRun]:
        if self.runs.name not in self.tables:
            return []
        with self.engine.connect() as conn:
            rows = (
                conn.execute(
                    sa.select(self.runs)
                    .where(self.runs.c.study == self.study)
                    .order_by(self.runs.c.factor, self.runs.c.seed, self.runs.c.map_key)
                )
                .mappings()
                .all()
            )
            scores = {}
            if run_scores_table.name in self.tables:
                found = conn.execute(sa.select(run_scores_table).where(run_scores_table.c.study == self.study)).all()
                scores = {(r.factor, r.seed, r.map_key): r.scores for r in found}
        return [
            RaceRun.from_record(dict(r) | {"scores": scores.get((r["factor"], r["seed"], r["map_key"]))}) for r in rows
        ]


@_retry_locked
def migrate_schema(engine: sa.Engine) -> None:
    """Bring a version-1 database to version 2: its ilr_audit table becomes ilr_race_runs, rows kept. One
    transaction looks and renames: on SQLite it holds the write lock from the start (BEGIN IMMEDIATE), so of two
    processes opening one old database at once the first renames and the second finds it renamed; on a server
    the rename is transactional DDL and the loser's look after the winner's commit finds it done. A database
    already migrated (or new) is left as it is."""
    if LEGACY_RACE_RUNS not in sa.inspect(engine).get_table_names():
        return  # nothing to rename: no lock taken
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "sqlite":
                conn.exec_driver_sql("BEGIN IMMEDIATE")  # the write lock before the look (pysqlite begins lazily)
            tables = set(sa.inspect(conn).get_table_names())
            if LEGACY_RACE_RUNS not in tables or race_runs_table.name in tables:
                return  # renamed by another process meanwhile (or a newer table beside a stray old one: keep both)
            conn.exec_driver_sql(f"ALTER TABLE {LEGACY_RACE_RUNS} RENAME TO {race_runs_table.name}")
            if schema_table.name in tables:
                conn.execute(
                    schema_table.update().where(schema_table.c.id == 1, schema_table.c.version < 2).values(version=2)
                )
    except (ProgrammingError, OperationalError):
        # A server: another process renamed it while this one waited for its lock (its look came first).
        if race_runs_table.name in sa.inspect(engine).get_table_names():
            return
        raise
    log.info("storage: table %s renamed %s (schema version 2)", LEGACY_RACE_RUNS, race_runs_table.name)


def ensure_schema(engine: sa.Engine) -> None:
    """Migrate an older database (migrate_schema), create the project's tables if missing and check their
    version; Optuna's tables are not touched."""
    migrate_schema(engine)
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
        elif version < SCHEMA_VERSION:  # a version-1 database that had no ilr_audit to rename
            conn.execute(schema_table.update().where(schema_table.c.id == 1).values(version=SCHEMA_VERSION))
        elif version > SCHEMA_VERSION:
            raise UserInputError(
                f"the database's ilr-search schema is version {version}, newer than this "
                f"ilr-search ({SCHEMA_VERSION}); upgrade ilr-search"
            )
