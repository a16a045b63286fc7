"""Storage URLs: checked before anything is opened (bad input changes nothing on disk) and masked when shown.

A `StorageSpec` is what the rest of the storage layer opens: an SQLite file, another SQL database, or a journal file.
Commands that only read (studies, trials, pareto, export, recipe) accept an SQLite file this process cannot write
(a mounted results folder, a shared file): it is opened read-only and its bytes stay as they are.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from ilr_search.errors import UserInputError
from ilr_search.folders import check_can_create

DEFAULT_STORAGE = "sqlite:///studies/ilr-search.db"


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
    # how an SQLite file is opened: "rw"; for a file this process cannot write (only reading commands accept one)
    # "ro" (SQLite's mode=ro, under the usual shared lock) or "immutable" (no locks, no side files; see read_mode)
    mode: str = "rw"

    @property
    def masked(self) -> str:
        return mask_url(self.url)

    @property
    def read_only(self) -> bool:
        return self.mode != "rw"

    def exists(self) -> bool:
        """False for a file-backed storage whose file is not there yet (nothing to read)."""
        return self.path is None or self.path.exists()


def parse_storage(url: str | None, read_only: bool = False) -> StorageSpec:
    """Check a storage URL without creating or changing anything. `read_only`: the caller only reads, so an SQLite
    file it cannot write is accepted, opened read-only (spec.mode); without it such a file is refused."""
    if not url:
        path = Path(DEFAULT_STORAGE[len("sqlite:///") :])
        if not path.parent.exists():  # studies/ is made on first use (after every check has passed)
            if not read_only:
                check_can_create(
                    path.parent,
                    f"the folder {str(path.parent)!r} of the default storage",
                    "run in a writable folder or give --storage",
                )
            return StorageSpec(DEFAULT_STORAGE, "sqlite", path, create_folder=True)
        url = DEFAULT_STORAGE
    if url.startswith("journal:"):
        path = Path(url[len("journal:") :]).expanduser()
        if not str(path) or str(path) == ".":
            raise UserInputError("journal storage needs a file: --storage journal:PATH")
        _check_writable_file(path, url)
        return StorageSpec(url, "journal", path)
    url = _prefer_installed_postgres_driver(url)
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise UserInputError(
            f"storage {mask_url(url)!r} is not a URL Optuna accepts; use sqlite:///FILE, "
            "postgresql://USER@HOST/DB, mysql://..., or journal:PATH"
        ) from None
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError:
        raise UserInputError(
            f"storage driver {parsed.drivername!r} is not supported; use sqlite, postgresql, mysql or journal:PATH"
        ) from None
    except ImportError as e:
        raise missing_driver(parsed.drivername, parsed.get_backend_name(), e.name) from None
    if dialect.name == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise UserInputError("an in-memory SQLite storage cannot be resumed; give a file: sqlite:///studies/x.db")
        path = Path(parsed.database)
        if read_only and path.is_file() and not os.access(path, os.W_OK):
            if not os.access(path, os.R_OK):
                raise UserInputError(
                    f"storage file {str(path)!r} is not readable; fix its permissions or choose another --storage"
                )
            mode = read_mode(path)
            _check_sqlite_file(path, read_uri(path, mode))
            return StorageSpec(url, "sqlite", path, mode=mode)
        if not read_only or path.exists():  # a reader of a file not there yet is told so when it opens it
            _check_writable_file(path, url)
        if path.exists():
            _check_sqlite_file(path)
        return StorageSpec(url, "sqlite", path)
    try:
        dialect.import_dbapi() if hasattr(dialect, "import_dbapi") else None
    except ImportError as e:
        raise missing_driver(parsed.drivername, dialect.name, e.name) from None
    return StorageSpec(url, "rdb")


def missing_driver(driver: str, backend: str, module: str | None) -> UserInputError:
    """The error of a storage `driver` whose module is not installed, with how to install it: the package's extra
    for PostgreSQL, the module's package for MySQL."""
    if backend == "postgresql":
        hint = "for PostgreSQL: pip install 'ilr-search[postgres]'"
    elif backend in ("mysql", "mariadb") and module == "pymysql":
        hint = "for MySQL: pip install pymysql"
    elif backend in ("mysql", "mariadb"):
        hint = "for MySQL: pip install mysqlclient, or pip install pymysql and give mysql+pymysql://USER@HOST/DB"
    else:
        hint = f"install the Python driver SQLAlchemy uses for {backend}"
    return UserInputError(f"storage driver {driver!r} needs a module that is not installed ({module}); {hint}")


def _prefer_installed_postgres_driver(url: str) -> str:
    """`postgresql://` means psycopg2 to SQLAlchemy; use psycopg (3) instead when only that is installed."""
    if not url.startswith(("postgresql://", "postgres://")):
        return url
    import importlib.util

    if importlib.util.find_spec("psycopg2") is None and importlib.util.find_spec("psycopg") is not None:
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def read_mode(path: Path) -> str:
    """How to open an SQLite file this process cannot write: "ro" (SQLite's mode=ro) reads under a shared lock,
    safe while someone with the right to write it does so, and needs nothing in the folder for a rollback-journal
    database (Optuna's). A WAL database needs its -shm file, which a read-only folder may not have and cannot
    get: there "immutable" (immutable=1: no locks, no side files; right where nobody can write, as in that folder)."""
    folder = path.parent if str(path.parent) else Path(".")
    with open(path, "rb") as f:
        header = f.read(20)
    wal = len(header) == 20 and header[18] == 2  # the file format version bytes: 2 in WAL mode
    return "immutable" if wal and not os.access(folder, os.W_OK) else "ro"


def read_uri(path: Path, mode: str) -> str:
    """The SQLite URI opening `path` read-only (`mode` as read_mode returned it), for sqlite3.connect(uri=True)."""
    options = "mode=ro&immutable=1" if mode == "immutable" else "mode=ro"
    return f"file:{quote(str(path.resolve()))}?{options}"


def _check_writable_file(path: Path, url: str) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if path.exists():
        if path.is_dir():
            raise UserInputError(f"storage {mask_url(url)!r} points at a folder; give a file")
        if not os.access(path, os.R_OK | os.W_OK):
            raise UserInputError(
                f"storage file {str(path)!r} is not writable; fix its permissions or choose another --storage"
            )
        return
    if not parent.exists():
        raise UserInputError(f"the folder {str(parent)!r} of storage {mask_url(url)!r} does not exist; create it first")
    check_can_create(parent, f"storage file {str(path)!r}", "choose a writable --storage")


def _check_sqlite_file(path: Path, uri: str | None = None) -> None:
    """An SQLite file's header and quick_check, read through `uri` (default: mode=ro on `path`)."""
    with open(path, "rb") as f:
        header = f.read(16)
    if header and header != b"SQLite format 3\x00":
        raise UserInputError(
            f"{str(path)!r} is not an SQLite database (corrupted or another kind of file); "
            "move it away or choose another --storage"
        )
    if header:
        import sqlite3

        try:
            with sqlite3.connect(uri or f"file:{path}?mode=ro", uri=True, timeout=0.2) as conn:
                conn.execute("PRAGMA schema_version").fetchone()
                ok = conn.execute("PRAGMA quick_check").fetchone()
        except sqlite3.OperationalError as e:
            if "locked" in str(e):  # another process is writing; the storage waits for it later
                return
            raise UserInputError(
                f"{str(path)!r} is a corrupted SQLite database ({e}); move it away or choose another --storage"
            ) from None
        except sqlite3.DatabaseError as e:
            raise UserInputError(
                f"{str(path)!r} is a corrupted SQLite database ({e}); move it away or choose another --storage"
            ) from None
        if ok is None or ok[0] != "ok":
            raise UserInputError(
                f"{str(path)!r} is a corrupted SQLite database ({ok}); move it away or choose another --storage"
            )
