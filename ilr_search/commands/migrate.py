"""`ilr-search migrate`: import now every study of a storage stored before the ledger of runs (schema version 1 to
4: storage/study_import.py), rather than when each is first opened."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna

from ilr_search.errors import UserInputError
from ilr_search.storage import JournalStore, open_storage, parse_storage
from ilr_search.storage.optuna_storage import rdb_engine
from ilr_search.storage.study_import import import_database, import_journal
from ilr_search.storage.trials import trial_record


@dataclass(frozen=True)
class MigrateReport:
    """The storage (its URL masked), its studies, and whether this call imported anything (False: nothing was
    stored before the ledger, or it was imported already)."""

    storage: str
    studies: tuple[str, ...]
    imported: bool

    def to_json(self) -> dict[str, Any]:
        return {"storage": self.storage, "studies": list(self.studies), "imported": self.imported}

    def text(self) -> str:
        if self.imported:
            return f"imported the studies of {self.storage} stored by an older ilr-search: {', '.join(self.studies)}"
        return f"nothing to import in {self.storage}: its studies are stored as this ilr-search stores them"


def migrate_storage(storage: str | None) -> MigrateReport:
    """Import the old records of every study of `storage` (a database's race runs' tables, map claims and reference
    attributes; a journal's side-file lines and reference attributes), once: a second call imports nothing."""
    spec = parse_storage(storage)
    if not spec.exists():
        raise UserInputError(f"storage {spec.masked} does not exist; give the --storage of the studies to import")
    st = open_storage(spec)
    names = tuple(s.study_name for s in optuna.get_all_study_summaries(st, include_best_trial=False))
    if spec.kind != "journal":
        return MigrateReport(spec.masked, names, import_database(rdb_engine(st)))
    changed = []
    for name in names:
        study_id = st.get_study_id_from_name(name)
        trials = [trial_record(t) for t in st.get_all_trials(study_id, deepcopy=False)]
        changed.append(
            import_journal(JournalStore(str(spec.path), name).path, name, st.get_study_user_attrs(study_id), trials)
        )
    return MigrateReport(spec.masked, names, any(changed))
