"""Opening Optuna's storage for a StorageSpec: a journal file, or an SQL database (SQLite with an atomic pop of
queued trials); its creation is serialised and a locked SQLite file is waited for. A running trial's liveness is
not Optuna's: it is its worker's run in the project's store (trial_groups.py, sweep_stale_trials)."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.trial import TrialState

from ilr_search.errors import UserInputError
from ilr_search.storage.journal_store import flocked
from ilr_search.storage.optuna_compat import (
    backend,
    remember_user_attrs,
    set_user_attrs_at_once,
    trial_id,
    trials_table,
)
from ilr_search.storage.urls import StorageSpec, read_uri

log = logging.getLogger("ilr_search")

SQLITE_TIMEOUT_S = 60


def wait_while_locked(spec: StorageSpec, max_wait_s: float = 600.0) -> None:
    """If another process holds an SQLite storage's write lock, say so once and wait for it (SQLite's own
    busy timeout would wait silently, then fail)."""
    if spec.kind != "sqlite" or spec.path is None or not spec.path.exists():
        return
    start, told = time.monotonic(), False
    while True:
        try:
            conn = sqlite3.connect(spec.path, timeout=0.5)
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.rollback()
            finally:
                conn.close()
            if told:
                log.warning("storage %s is free again; going on", spec.masked)
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e):
                return  # not a lock: opening the storage reports it
        if not told:
            log.warning(
                "storage %s is locked by another process; waiting for it and retrying (Ctrl-C to stop)", spec.masked
            )
            told = True
        if time.monotonic() - start > max_wait_s:
            raise UserInputError(
                f"storage {spec.masked} stayed locked by another process for {max_wait_s:.0f} s; "
                "stop that process or retry later"
            )
        time.sleep(1.0)


def engine_kwargs(spec: StorageSpec) -> dict[str, Any]:
    """How every engine to `spec` is made: SQLite waits up to SQLITE_TIMEOUT_S for a lock (a read-only file is
    connected to through its read-only URI), servers' pooled connections are checked before use."""
    if spec.kind == "sqlite" and spec.read_only:
        assert spec.path is not None
        return {"creator": functools.partial(connect_read_only, read_uri(spec.path, spec.mode))}
    if spec.kind == "sqlite":
        return {"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
    return {"pool_pre_ping": True}


def connect_read_only(uri: str) -> sqlite3.Connection:
    """An SQLite connection that cannot write (SQLite refuses every write on it), as SQLAlchemy's pysqlite
    dialect would make one: usable from the pool's threads."""
    return sqlite3.connect(uri, uri=True, timeout=SQLITE_TIMEOUT_S, check_same_thread=False)


class JournalFlock:
    """The journal's write lock for Optuna's JournalFileBackend (its `lock_obj`): an flock on `<journal>.flock`.
    The kernel releases an flock when its holder dies, kill -9 included. Optuna's own lock files outlive a killed
    holder by their 30 s grace period, in which no worker can write (heartbeats included): the trials of live
    workers then looked stale and were failed, and their maps trained twice."""

    def __init__(self, journal_path: str) -> None:
        self.path = journal_path + ".flock"
        self._fd: int | None = None
        self._threads = threading.Lock()  # the flock excludes processes; one holder thread at a time here

    def acquire(self, blocking: bool = True) -> bool:
        if not self._threads.acquire(blocking):
            return False
        fd = None
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException as e:  # held elsewhere (not blocking), Ctrl-C while waiting, an unwritable folder
            if fd is not None:
                os.close(fd)
            self._threads.release()
            if blocking or not isinstance(e, BlockingIOError):
                raise
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            self._threads.release()


def open_storage(spec: StorageSpec) -> optuna.storages.BaseStorage:
    """The Optuna storage. A read-only SQLite file (spec.read_only) is only read: no tables created, no lock
    file."""
    if spec.read_only:
        return _open_read_only(spec)
    if spec.create_folder and spec.path is not None:
        spec.path.parent.mkdir(parents=True, exist_ok=True)
    if spec.kind == "journal":
        from optuna.storages.journal import JournalFileBackend

        path = str(spec.path)
        return optuna.storages.JournalStorage(JournalFileBackend(path, lock_obj=JournalFlock(path)))  # type: ignore[arg-type]  # duck-typed: Optuna's lock base class is private
    wait_while_locked(spec)
    for attempt in range(5):
        try:
            with _creation_lock(spec):
                storage_class = SQLiteStorage if spec.kind == "sqlite" else optuna.storages.RDBStorage
                return storage_class(spec.url, engine_kwargs=engine_kwargs(spec))
        except (sa.exc.IntegrityError, sa.exc.ProgrammingError):
            # two workers created Optuna's tables at once (another machine, on a server): the tables exist now
            time.sleep(0.2 * (attempt + 1))
        except sa.exc.OperationalError as e:
            if "already exists" not in str(e):  # (SQLite reports a table created by another process so)
                raise cannot_open(spec, e) from None
            time.sleep(0.2 * (attempt + 1))
        except sa.exc.DatabaseError as e:
            raise cannot_open(spec, e) from None
    raise UserInputError(f"cannot initialise storage {spec.masked}: other workers keep creating it; retry")


def _open_read_only(spec: StorageSpec) -> optuna.storages.RDBStorage:
    """Optuna's storage on an SQLite file opened read-only. Optuna creates its tables unless told not to
    (skip_table_creation), and writes its version rows where they are missing (a file Optuna did not make): the
    read-only connection refuses that write, reported as one error. Its schema check only reads."""
    try:
        return optuna.storages.RDBStorage(spec.url, engine_kwargs=engine_kwargs(spec), skip_table_creation=True)
    except (sa.exc.DatabaseError, RuntimeError) as e:  # RuntimeError: Optuna's schema check (an older schema)
        raise UserInputError(
            f"cannot read storage {spec.masked} (opened read-only: this process cannot write the "
            f"file): {str(getattr(e, 'orig', e)).splitlines()[0]}"
        ) from None


def cannot_open(spec: StorageSpec, e: Exception) -> UserInputError:
    return UserInputError(f"cannot open storage {spec.masked}: {str(getattr(e, 'orig', e)).splitlines()[0]}")


def rdb_engine(storage: optuna.storages.BaseStorage) -> sa.Engine:
    """The database engine of an open Optuna RDB storage, also as a Study holds it (in Optuna's cache)."""
    storage = backend(storage)
    if not isinstance(storage, optuna.storages.RDBStorage):
        raise TypeError(f"{type(storage).__name__} has no database engine")
    return storage.engine


class SQLiteStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage with an atomic pop of a queued (WAITING) trial.

    RDBStorage guards the pop with SELECT ... FOR UPDATE, which SQLite ignores, and pysqlite starts its write
    transaction only at the UPDATE: two workers could both read an enqueued trial as WAITING and both run it
    (optuna/optuna#4002; 6-14 double pops of 60 trials by 4 processes here). One conditional UPDATE is atomic.
    """

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Sequence[float] | None = None) -> bool:
        if state != TrialState.RUNNING or values is not None:
            return super().set_trial_state_values(trial_id, state, values)
        trials = trials_table()
        with self.engine.begin() as conn:
            popped = conn.execute(
                trials.update()
                .where(
                    trials.c.trial_id == trial_id,
                    trials.c.state == TrialState.WAITING,
                )
                .values(state=TrialState.RUNNING, datetime_start=datetime.now())
            ).rowcount
        if popped == 1:
            return True
        self.check_trial_is_updatable(trial_id, self.get_trial(trial_id).state)  # raises if it finished
        return False


@contextmanager
def _creation_lock(spec: StorageSpec) -> Iterator[None]:
    """Processes on one machine that open the same SQLite file take turns while Optuna checks or creates its
    tables (which is not safe to race: a second process could see the file half made, with some tables and not
    others, and fail with "table ... already exists"). The lock file lives in the temp folder, not beside the
    database."""
    if spec.kind != "sqlite" or spec.path is None:
        yield
        return
    key = hashlib.sha256(str(spec.path.resolve()).encode()).hexdigest()[:16]
    with flocked(Path(tempfile.gettempdir()) / f"ilr-search-{key}.lock"):
        yield


def set_trial_user_attrs(trial: optuna.Trial, attrs: Mapping[str, Any]) -> None:
    """Several user attributes of a running trial at once: one transaction (one fsync on SQLite) on an SQL
    storage instead of one per attribute; one write each on a journal."""
    set_user_attrs_at_once(trial.storage, trial_id(trial), attrs)
    remember_user_attrs(trial, attrs)
