"""How the CLI's process logs: set by the CLI when a command starts, never on import, so that a program using the
Python API (api.py) keeps its own logging settings."""

from __future__ import annotations


def quiet_optuna() -> None:
    """Optuna logs errors only: a failed trial (a divergence, Ctrl-C) is reported by the run itself, and Optuna's
    INFO lines (a study created, each trial's values) and warnings would add noise and tracebacks. Worker
    processes take the level of the process that starts them (commands/workers.py)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
