"""Opening the project's store for a StorageSpec: a journal's side file, or the tables of its SQL database."""

from __future__ import annotations

import sqlalchemy as sa

from .journal_store import JournalStore
from .optuna_storage import engine_kwargs
from .sql_store import SQLStore
from .store import Store
from .urls import StorageSpec


def open_store(spec: StorageSpec, study: str, read_only: bool = False) -> Store:
    """The store of `study`; `read_only` creates nothing (a table not there reads empty)."""
    if spec.kind == "journal":
        return JournalStore(str(spec.path), study)
    engine = sa.create_engine(spec.url, **engine_kwargs(spec))
    return SQLStore(engine, study, read_only=read_only)
