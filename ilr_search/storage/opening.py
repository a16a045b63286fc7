"""Opening the project's store for a StorageSpec: a journal's side file, or the tables of its SQL database on
the engine of the Optuna storage the process already has open there (one database handle per worker), a study
stored before the ledger imported first (study_import.py); a study's reference runs read from it."""

from __future__ import annotations

import optuna
import sqlalchemy as sa

from ilr_search.errors import UserInputError
from ilr_search.storage.journal_store import JournalStore
from ilr_search.storage.optuna_compat import study_storage
from ilr_search.storage.optuna_storage import engine_kwargs, rdb_engine
from ilr_search.storage.sql_store import SQLStore
from ilr_search.storage.store import Run, Store, stored_references
from ilr_search.storage.study_import import import_database, import_journal, needs_import
from ilr_search.storage.trials import trial_record
from ilr_search.storage.urls import StorageSpec


def open_store(
    spec: StorageSpec, study: str, read_only: bool = False, storage: optuna.storages.BaseStorage | None = None
) -> Store:
    """The store of `study`; `read_only` creates nothing (a table not there reads empty) but the import of a study
    stored before the ledger, done once on whichever opening comes first. `storage`: the Optuna storage already
    open on `spec` (as open_storage returned it, or a Study's), whose engine the store shares; without it an SQL
    store makes its own engine, with the same settings (and a journal study's attributes are not imported)."""
    if spec.kind == "journal":
        store = JournalStore(str(spec.path), study)
        attrs, trials = {}, []
        if storage is not None:
            try:
                study_id = storage.get_study_id_from_name(study)
            except KeyError:  # no such study yet
                pass
            else:
                attrs = storage.get_study_user_attrs(study_id)
                trials = [trial_record(t) for t in storage.get_all_trials(study_id, deepcopy=False)]
        import_journal(store.path, study, attrs, trials)
        return store
    engine = rdb_engine(storage) if storage is not None else sa.create_engine(spec.url, **engine_kwargs(spec))
    if spec.read_only and needs_import(engine):
        raise UserInputError(
            f"storage {spec.masked} was stored by an older ilr-search and this process cannot write it to import it; "
            f"run `ilr-search migrate --storage {spec.masked}` once where it can be written"
        )
    import_database(engine)
    return SQLStore(engine, study, read_only=read_only)


def study_references(spec: StorageSpec, study: optuna.Study) -> dict[str, Run]:
    """The reference runs of `study` (open on `spec`) by name (stored_references), read through a read-only
    store."""
    store = open_store(spec, study.study_name, read_only=True, storage=study_storage(study))
    return stored_references(store.reference_runs())
