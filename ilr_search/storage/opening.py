"""Opening the project's store for a StorageSpec: a journal's side file, or the tables of its SQL database on
the engine of the Optuna storage the process already has open there (one database handle per worker); a study's
reference runs read from it."""

from __future__ import annotations

import optuna
import sqlalchemy as sa

from ilr_search.storage.journal_store import JournalStore
from ilr_search.storage.optuna_compat import study_storage
from ilr_search.storage.optuna_storage import engine_kwargs, rdb_engine
from ilr_search.storage.sql_store import SQLStore
from ilr_search.storage.store import RunRecord, Store, stored_references
from ilr_search.storage.urls import StorageSpec


def open_store(
    spec: StorageSpec, study: str, read_only: bool = False, storage: optuna.storages.BaseStorage | None = None
) -> Store:
    """The store of `study`; `read_only` creates nothing (a table not there reads empty). `storage`: the Optuna
    storage already open on `spec` (as open_storage returned it, or a Study's), whose engine the store shares;
    without it an SQL store makes its own engine, with the same settings."""
    if spec.kind == "journal":
        return JournalStore(str(spec.path), study)
    engine = rdb_engine(storage) if storage is not None else sa.create_engine(spec.url, **engine_kwargs(spec))
    return SQLStore(engine, study, read_only=read_only)


def study_references(spec: StorageSpec, study: optuna.Study) -> dict[str, RunRecord]:
    """The reference runs of `study` (open on `spec`) by name (stored_references), read through a read-only
    store."""
    store = open_store(spec, study.study_name, read_only=True, storage=study_storage(study))
    return stored_references(store.reference_runs(), study.user_attrs)
