"""Storage URLs: checked before anything is opened (bad input changes nothing on disk) and masked when shown.

A `StorageSpec` is what the rest of the storage layer opens: an SQLite file, another SQL database, or a journal file.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from ilr_search.errors import UserInputError

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
