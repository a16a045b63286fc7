"""The one door to Optuna's private names.

ilr-search needs a few things Optuna keeps private: a study's storage and a trial's storage id (for stale-trial
sweeps and reading a trial back by id), the RDB storage under Optuna's cache, the trials table (for
SQLite's atomic pop of a queued trial) and writing several user attributes in one transaction; and it patches one
function of TPE's, which cannot order the pruned trials of a multi-objective study (_pruned_trial_score). Every use of a
private Optuna name is here and nowhere else, each one has a test (tests/test_optuna_compat.py), so an Optuna
upgrade that breaks one fails a test named after it. Optuna's semantic versioning does not cover these names, so
the version is checked at import.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.storages import BaseStorage, RDBStorage
from optuna.trial import FrozenTrial

TESTED_MAJOR = 5

if int(optuna.__version__.split(".")[0]) != TESTED_MAJOR:
    raise ImportError(
        f"ilr-search uses private parts of Optuna {TESTED_MAJOR}.x (see ilr_search/storage/"
        f"optuna_compat.py), found Optuna {optuna.__version__}; install 'optuna>={TESTED_MAJOR},"
        f"<{TESTED_MAJOR + 1}'"
    )

from optuna.samplers._tpe import sampler as _tpe_sampler  # noqa: E402
from optuna.storages._cached_storage import _CachedStorage  # noqa: E402
from optuna.storages._rdb import models as _rdb_models  # noqa: E402
from optuna.storages._rdb.storage import _create_scoped_session  # noqa: E402
from optuna.study import StudyDirection  # noqa: E402

# The retry of a stale trial and metric names are marked experimental; ilr-search uses them on purpose (every
# module that calls them imports the storage package, and so this one).
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def study_storage(study: optuna.Study) -> BaseStorage:
    """The storage a study reads and writes through (Optuna's cache over an RDB storage, or the storage itself)."""
    return study._storage


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """A trial's id in its storage (not its number within the study), as the storage's methods take it."""
    return trial._trial_id


def study_id(study: optuna.Study | optuna.study.StudySummary) -> int:
    """A study's id in its storage."""
    return study._study_id


def backend(storage: BaseStorage) -> BaseStorage:
    """The storage under Optuna's cache: the RDB storage itself for a study's storage on SQL."""
    return storage._backend if isinstance(storage, _CachedStorage) else storage


def trials_table() -> sa.Table:
    """The SQL table of trials in an RDB storage (trial_id, state, datetime_start, ...)."""
    return _rdb_models.TrialModel.__table__


def set_user_attrs_at_once(storage: BaseStorage, trial_id_: int, attrs: Mapping[str, Any]) -> None:
    """Several user attributes of a running trial in one transaction on an SQL storage (one write each on any other
    storage): values are JSON-encoded as Optuna's own set_trial_user_attr stores them."""
    storage = backend(storage)
    if isinstance(storage, RDBStorage):
        with _create_scoped_session(storage.scoped_session, True) as session:
            for key, value in attrs.items():
                storage._set_trial_attr_without_commit(
                    session, _rdb_models.TrialUserAttributeModel, trial_id_, key, value
                )
    else:
        for key, value in attrs.items():
            storage.set_trial_user_attr(trial_id_, key, value)


def remember_user_attrs(trial: optuna.Trial, attrs: Mapping[str, Any]) -> None:
    """Make a running trial's `user_attrs` show attributes written around it (as Trial.set_user_attr does)."""
    trial._cached_frozen_trial.user_attrs.update(attrs)


def _pruned_trial_score(trial: FrozenTrial, study: optuna.Study) -> tuple[float, float]:
    """TPE's order of pruned trials (the deepest first, then the best last intermediate value), for a study of any
    number of objectives: Optuna 5.1's reads `study.direction`, which a multi-objective study has not, and so
    stopped every two-objective TPE study once two of its trials had been pruned with intermediate values (what
    ilr-search stores for the dashboard). The intermediate values are validation losses, taken in the first
    objective's direction (ilr-search's is perplexity, minimised)."""
    if not trial.intermediate_values:
        return 1, 0.0
    step, value = max(trial.intermediate_values.items())
    if math.isnan(value):
        return -step, float("inf")
    return -step, value if study.directions[0] == StudyDirection.MINIMIZE else -value


_tpe_sampler._get_pruned_trial_score = _pruned_trial_score  # noqa: SLF001 -- the one patch of Optuna (above)
