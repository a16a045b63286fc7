"""The search: Optuna proposes reuse maps (and knob settings) under a FLOP budget, each trains as a proxy, and the
study (configuration, trials, curves, fronts) lives in a storage it resumes from.

- maps.py: proposals repaired into the budget, and the first maps a study tries;
- samplers.py and pruners.py: how maps are proposed, and how bad ones stop early (both stored with the study);
- plan.py: what a study is (configuration, name) and the checks on resume;
- trial_groups.py: a worker's trials, asked in groups of 1..K (claim the map's run, reuse or wait, train, record,
  tell), the worker's heartbeat and stale-trial sweeps;
- run.py: a study run to its target, with its reference runs; progress.py: what it reports;
- race.py: then its contenders at more seeds and longer, as the racing policy (racing.py) decides; race_results.py:
  the race as stored (its state, report, answer and decided front);
- studies.py: stored studies read back.
"""

import importlib
from typing import Any

# The package's names, each loaded from its module on first use: reading a stored study (studies.py) does not
# import the trainer, and so not torch; and importing the package alone imports neither torch nor Optuna (the
# CLI's renderer imports progress.py). Optuna's log level is the CLI's to set (commands/logs.py), not an import's.
_EXPORTS = {
    "CONFIG_ATTR": "plan",
    "SAMPLER_ATTR": "plan",
    "StudyPlan": "plan",
    "plan_study": "plan",
    "RunReporter": "progress",
    "PreparedStudy": "run",
    "RunRequest": "run",
    "prepare_study": "run",
    "run_in_process": "run",
    "default_study": "studies",
    "list_studies": "studies",
    "list_trials": "studies",
    "open_study": "studies",
    "summarize_stored": "studies",
    "trials_report": "studies",
    "StudyReport": "studies",
    "study_report": "studies",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
