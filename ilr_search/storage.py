"""Storage URLs: checked before anything is opened (bad input changes nothing on disk), masked when shown,
and opened as Optuna storages (RDB with heartbeats, or a journal file) with the project's store beside them."""

from __future__ import annotations

import fcntl
import logging
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.storages._rdb import models as rdb_models
from optuna.trial import TrialState
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from .errors import UserInputError
from .store import JournalStore, SQLStore, Store

log = logging.getLogger("ilr_search")

DEFAULT_STORAGE = "sqlite:///studies/ilr-search.db"
SQLITE_TIMEOUT_S = 60


def heartbeat_interval() -> int:
    """Seconds between a running trial's heartbeats; a trial silent for the grace period is stale."""
    return max(1, int(os.environ.get("ILR_SEARCH_HEARTBEAT_SECONDS", "10")))


def grace_period() -> int:
    """Several intervals, so that a loaded machine that delays a beat or two does not fail a live trial."""
    return 4 * heartbeat_interval() + 1


def mask_url(url: str) -> str:
    """The URL with its password replaced by ***."""
    if url.startswith("journal:"):
        return url
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "<unparseable storage URL>"


@dataclass(frozen=True)
class StorageSpec:
    url: str
    kind: str  # "sqlite", "rdb" (postgresql, mysql, ...) or "journal"
    path: Path | None = None  # the file, for sqlite and journal
    create_folder: bool = False  # the default storage's studies/ folder is made when first written

    @property
    def masked(self) -> str:
        return mask_url(self.url)

    def exists(self) -> bool:
        """False for a file-backed storage whose file is not there yet (nothing to read)."""
        return self.path is None or self.path.exists()


def parse_storage(url: str | None) -> StorageSpec:
    """Check a storage URL without creating or changing anything."""
    if not url:
        path = Path(DEFAULT_STORAGE[len("sqlite:///"):])
        if not path.parent.exists():  # studies/ is made on first use (after every check has passed)
            return StorageSpec(DEFAULT_STORAGE, "sqlite", path, create_folder=True)
        url = DEFAULT_STORAGE
    if url.startswith("journal:"):
        path = Path(url[len("journal:"):]).expanduser()
        if not str(path) or str(path) == ".":
            raise UserInputError("journal storage needs a file: --storage journal:PATH")
        _check_writable_file(path, url)
        return StorageSpec(url, "journal", path)
    url = _prefer_installed_postgres_driver(url)
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise UserInputError(f"storage {mask_url(url)!r} is not a URL Optuna accepts; use sqlite:///FILE, "
                             "postgresql://USER@HOST/DB, mysql://..., or journal:PATH") from None
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError:
        raise UserInputError(f"storage driver {parsed.drivername!r} is not supported; use sqlite, postgresql, mysql "
                             "or journal:PATH") from None
    except ImportError as e:
        raise UserInputError(f"storage driver {parsed.drivername!r} needs a module that is not installed ({e.name}); "
                             "for PostgreSQL: pip install 'ilr-search[postgres]'") from None
    if dialect.name == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise UserInputError("an in-memory SQLite storage cannot be resumed; give a file: sqlite:///studies/x.db")
        path = Path(parsed.database)
        _check_writable_file(path, url)
        if path.exists():
            _check_sqlite_file(path)
        return StorageSpec(url, "sqlite", path)
    try:
        dialect.import_dbapi() if hasattr(dialect, "import_dbapi") else None
    except ImportError as e:
        raise UserInputError(f"storage driver {parsed.drivername!r} needs a module that is not installed ({e.name}); "
                             "for PostgreSQL: pip install 'ilr-search[postgres]'") from None
    return StorageSpec(url, "rdb")


def _prefer_installed_postgres_driver(url: str) -> str:
    """`postgresql://` means psycopg2 to SQLAlchemy; use psycopg (3) instead when only that is installed."""
    if not url.startswith(("postgresql://", "postgres://")):
        return url
    import importlib.util

    if importlib.util.find_spec("psycopg2") is None and importlib.util.find_spec("psycopg") is not None:
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def _check_writable_file(path: Path, url: str) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if path.exists():
        if path.is_dir():
            raise UserInputError(f"storage {mask_url(url)!r} points at a folder; give a file")
        if not os.access(path, os.R_OK | os.W_OK):
            raise UserInputError(f"storage file {str(path)!r} is not writable; fix its permissions or choose another --storage")
        return
    if not parent.exists():
        raise UserInputError(f"the folder {str(parent)!r} of storage {mask_url(url)!r} does not exist; create it first")
    try:  # a real probe: os.access says yes for root where the file system still says no (sysfs, read-only mounts)
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise UserInputError(f"cannot create storage file in {str(parent)!r} ({e.strerror}); "
                             "choose a writable --storage") from None


def _check_sqlite_file(path: Path) -> None:
    with open(path, "rb") as f:
        header = f.read(16)
    if header and header != b"SQLite format 3\x00":
        raise UserInputError(f"{str(path)!r} is not an SQLite database (corrupted or another kind of file); "
                             "move it away or choose another --storage")
    if header:
        import sqlite3

        try:
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.2) as conn:
                conn.execute("PRAGMA schema_version").fetchone()
                ok = conn.execute("PRAGMA quick_check").fetchone()
        except sqlite3.OperationalError as e:
            if "locked" in str(e):  # another process is writing; the storage waits for it later
                return
            raise UserInputError(f"{str(path)!r} is a corrupted SQLite database ({e}); move it away or choose "
                                 "another --storage") from None
        except sqlite3.DatabaseError as e:
            raise UserInputError(f"{str(path)!r} is a corrupted SQLite database ({e}); move it away or choose "
                                 "another --storage") from None
        if ok is None or ok[0] != "ok":
            raise UserInputError(f"{str(path)!r} is a corrupted SQLite database ({ok}); move it away or choose "
                                 "another --storage")


def wait_while_locked(spec: StorageSpec, max_wait_s: float = 600.0) -> None:
    """If another process holds an SQLite storage's write lock, say so once and wait for it (SQLite's own
    busy timeout would wait silently, then fail)."""
    if spec.kind != "sqlite" or spec.path is None or not spec.path.exists():
        return
    import sqlite3

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
            log.warning("storage %s is locked by another process; waiting for it and retrying (Ctrl-C to stop)",
                        spec.masked)
            told = True
        if time.monotonic() - start > max_wait_s:
            raise UserInputError(f"storage {spec.masked} stayed locked by another process for {max_wait_s:.0f} s; "
                                 "stop that process or retry later")
        time.sleep(1.0)


def _engine_kwargs(spec: StorageSpec) -> dict:
    if spec.kind == "sqlite":
        return {"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
    return {"pool_pre_ping": True}


def open_storage(spec: StorageSpec, heartbeat: bool = True) -> optuna.storages.BaseStorage:
    """The Optuna storage; RDB storages get heartbeats that fail and retry a killed worker's trial."""
    if spec.create_folder and spec.path is not None:
        spec.path.parent.mkdir(parents=True, exist_ok=True)
    if spec.kind == "journal":
        from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

        path = str(spec.path)
        return optuna.storages.JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))
    kwargs = {}
    if heartbeat:
        kwargs = {"heartbeat_interval": heartbeat_interval(), "grace_period": grace_period(),
                  "heartbeat_stale_trial_callback": optuna.storages.RetryHeartbeatStaleTrialCallback()}
    wait_while_locked(spec)
    for attempt in range(5):
        try:
            with _creation_lock(spec):
                storage_class = SQLiteStorage if spec.kind == "sqlite" else optuna.storages.RDBStorage
                return storage_class(spec.url, engine_kwargs=_engine_kwargs(spec), **kwargs)
        except (sa.exc.IntegrityError, sa.exc.ProgrammingError):
            # two workers created Optuna's tables at once (another machine, on a server): the tables exist now
            time.sleep(0.2 * (attempt + 1))
        except (sa.exc.OperationalError, sa.exc.DatabaseError) as e:
            raise UserInputError(f"cannot open storage {spec.masked}: "
                                 f"{str(e.orig if hasattr(e, 'orig') else e).splitlines()[0]}") from None
    raise UserInputError(f"cannot initialise storage {spec.masked}: other workers keep creating it; retry")


class SQLiteStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage with an atomic pop of a queued (WAITING) trial.

    RDBStorage guards the pop with SELECT ... FOR UPDATE, which SQLite ignores, and pysqlite starts its write
    transaction only at the UPDATE: two workers could both read an enqueued trial as WAITING and both run it
    (optuna/optuna#4002; 6-14 double pops of 60 trials by 4 processes here). One conditional UPDATE is atomic.
    """

    def set_trial_state_values(self, trial_id: int, state: TrialState,
                               values: Sequence[float] | None = None) -> bool:
        if state != TrialState.RUNNING or values is not None:
            return super().set_trial_state_values(trial_id, state, values)
        trials = rdb_models.TrialModel.__table__
        with self.engine.begin() as conn:
            popped = conn.execute(trials.update().where(
                trials.c.trial_id == trial_id, trials.c.state == TrialState.WAITING,
            ).values(state=TrialState.RUNNING, datetime_start=datetime.now())).rowcount
        if popped == 1:
            return True
        self.check_trial_is_updatable(trial_id, self.get_trial(trial_id).state)  # raises if it finished
        return False


@contextmanager
def _creation_lock(spec: StorageSpec) -> Iterator[None]:
    """Processes on one machine that create the same new SQLite file take turns (Optuna's table creation
    is not safe to race). The lock file lives in the temp folder, not beside the database."""
    if spec.kind != "sqlite" or (spec.path is not None and spec.path.exists() and spec.path.stat().st_size > 0):
        yield
        return
    key = hashlib.sha256(str(spec.path.resolve()).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"ilr-search-{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def open_store(spec: StorageSpec, study: str, read_only: bool = False) -> Store:
    if spec.kind == "journal":
        return JournalStore(str(spec.path), study)
    engine = sa.create_engine(spec.url, **_engine_kwargs(spec))
    return SQLStore(engine, study, read_only=read_only)


class Heartbeat:
    """Calls `beat()` at once and then every heartbeat interval from a daemon thread, until the context exits
    or `beat` returns False (what it beats for is over). A transient error skips one beat, never ends them."""

    def __init__(self, beat: Callable[[], bool]) -> None:
        self._beat_once = beat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            try:
                if self._beat_once() is False:
                    return
            except Exception:  # a lock, a full disk for a moment: beat again next interval
                pass
            if self._stop.wait(heartbeat_interval()):
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
