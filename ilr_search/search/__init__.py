"""The search: Optuna proposes reuse maps (and knob settings) under a FLOP budget, each trains as a proxy, and the
study (configuration, trials, curves, fronts) lives in a storage it resumes from.

- maps.py: proposals repaired into the budget, and the first maps a study tries;
- samplers.py and pruners.py: how maps are proposed, and how bad ones stop early (both stored with the study);
- plan.py: what a study is (configuration, name) and the checks on resume;
- objective.py: one trial (claim, reuse or wait, train, record), heartbeats and stale-trial sweeps;
- run.py: a study run to its target, with its reference runs; progress.py: what it reports;
- race.py: then its contenders at more seeds and longer, as the racing policy (racing.py) decides;
- studies.py: stored studies read back.
"""

import warnings

import optuna

from .plan import CONFIG_ATTR, FIDELITY_ATTR, SAMPLER_ATTR, StudyPlan, plan_study
from .progress import RunReporter
from .run import PreparedStudy, prepare_study, run_study
from .studies import default_study, list_studies, list_trials, open_study, summarize_stored, trials_report

# Failed trials (a divergence, Ctrl-C) are reported by the run itself; Optuna's warnings would add tracebacks.
optuna.logging.set_verbosity(optuna.logging.ERROR)
# Heartbeats, stale-trial sweeps and metric names are marked experimental; the run uses them on purpose.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

__all__ = ["CONFIG_ATTR", "FIDELITY_ATTR", "SAMPLER_ATTR", "PreparedStudy", "RunReporter", "StudyPlan", "default_study",
           "list_studies", "list_trials", "open_study", "plan_study", "prepare_study", "run_study", "summarize_stored",
           "trials_report"]
