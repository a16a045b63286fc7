"""How a run uses the machine's cores: the processes and torch threads of its phases, from the cores the run may
use (its CPU affinity) and never from how busy the machine looks.

Threads and fusion change the float rounding of training, and at the default space's lr a rounding difference
grows to a seed-sized one within about 100 steps: a layout read from a load average (which lags the machine by a
minute) would make the same command give another study. So nothing here reads the load, and the layout of a given
machine (and OMP_NUM_THREADS, where set) is always the same; the run stores it with the study (search/plan.py
StudyLayout) and a resume reuses it.
"""

from __future__ import annotations

import os

from ilr_search.config import SpaceConfig
from ilr_search.training.device import resolve_device


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a container's or `taskset`'s limit), else all."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def thread_cap() -> int | None:
    """OMP_NUM_THREADS where it is set to a positive number: the most threads the user lets one process use."""
    try:
        value = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        return None
    return value if value >= 1 else None


def on_cpu(space: SpaceConfig) -> bool:
    return resolve_device(space.train.device).type == "cpu"


def process_threads(space: SpaceConfig, processes: int) -> int | None:
    """Torch threads for each of `processes` processes sharing the usable cores (at most OMP_NUM_THREADS); None
    off a CPU (not set)."""
    if not on_cpu(space):
        return None
    threads = max(1, usable_cores() // max(1, processes))
    cap = thread_cap()
    return threads if cap is None else min(threads, cap)


def trial_lanes(space: SpaceConfig, processes: int, fuse: int) -> int:
    """Lanes for the trials and reference runs (training/jobs.py): on a CPU of several cores, a run of one process
    that fuses (K > 1) trains in one lane a usable core, at most K lanes (process_threads shares the cores among
    them); else 1."""
    cores = usable_cores()
    if processes != 1 or fuse < 2 or cores < 2 or not on_cpu(space):
        return 1
    return min(cores, fuse)


def race_processes(space: SpaceConfig, groups: int) -> int:
    """Race worker processes for a run of `groups` worker processes: one a usable core on a CPU with several when
    the run is one process (a multi-process run races in its workers already); 1 (in the run's own process)
    otherwise."""
    cores = usable_cores()
    if groups != 1 or cores < 2 or not on_cpu(space):
        return 1
    return cores
