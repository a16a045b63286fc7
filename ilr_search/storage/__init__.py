"""The storage layer: where a study lives and how it is opened.

- urls: storage URLs checked (nothing opened) and masked: StorageSpec, parse_storage;
- optuna_storage: Optuna's storage for a spec (journal, SQLite with an atomic pop, or a server): open_storage;
  a trial's attributes written in one transaction: set_trial_user_attrs;
- heartbeat: how often running work beats and when silence means it died: Heartbeat; a worker's name: new_worker;
- store: the project's own records beside Optuna's trials (curves, pruning, fronts, and the runs: race, reference,
  trial and worker, the claimed ones by one protocol): Store; Run, the one record of a stored run of any kind; the
  study's results in one list: study_ledger;
- sql_store, journal_store: the Store in the study's SQL database, or in a file beside a journal;
- trials: the names of the attributes the objective writes on a trial, and a study's trials read from Optuna
  once, into TrialRecord, each with the result on its map's run: study_trials (which trials count as trained
  results: trained_results); in the states Optuna was told, as the search schedules them: told_trials;
- study_import: a study stored before the ledger of runs, imported once (open_store; `ilr-search migrate`);
- optuna_compat: the one door to Optuna's private names (a study's storage, trial ids...);
- opening: the Store of a spec, on the engine of the Optuna storage open there: open_store; a study's
  reference runs read through it: study_references.
"""

from ilr_search.storage.heartbeat import Heartbeat, grace_period, heartbeat_interval, new_worker
from ilr_search.storage.journal_store import JournalStore
from ilr_search.storage.opening import open_store, study_references
from ilr_search.storage.optuna_compat import study_id, study_storage, trial_id
from ilr_search.storage.optuna_storage import open_storage, set_trial_user_attrs
from ilr_search.storage.sql_store import SQLStore
from ilr_search.storage.store import (
    CurvePoint,
    Run,
    RunJob,
    Store,
    TrainCurvePoint,
    reference_run,
    stored_references,
)
from ilr_search.storage.urls import StorageSpec, parse_storage

__all__ = [
    "RunJob",
    "Run",
    "reference_run",
    "stored_references",
    "study_references",
    "CurvePoint",
    "Heartbeat",
    "JournalStore",
    "SQLStore",
    "StorageSpec",
    "Store",
    "grace_period",
    "heartbeat_interval",
    "new_worker",
    "open_storage",
    "open_store",
    "parse_storage",
    "set_trial_user_attrs",
    "TrainCurvePoint",
    "study_id",
    "study_storage",
    "trial_id",
]
