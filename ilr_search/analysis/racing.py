"""Racing reuse maps across seeds and training lengths: pure policies over stored evaluations.

Every evaluation of a map is one (map, steps, seed) result. A policy reads all of them and says which
contenders are still open, which jobs to train next, which maps are eliminated and why, and what the front at
the target length is, with intervals and whether each point is confirmed. It keeps no state of its own: the
same evaluations give the same decision, so a resumed study, a second worker and a replay over a truth table
(benchmarks/replays/policy.py) agree.

Two policies (RaceSettings.policy):
- "adaptive" (adaptive_race.py, the default): judged at the target, seeds added until each comparison with the
  baseline is decided by a sequential test that keeps its level (sequential.py);
- "fixed" (fixed_race.py): a fixed number of seeds at each doubled length, eliminations at every length.
  Studies made before the adaptive race keep it.
race_core.py holds what both share; this module picks the policy.
"""

from __future__ import annotations

from collections.abc import Sequence

from ilr_search.analysis.adaptive_race import adaptive_race_state
from ilr_search.analysis.fixed_race import fixed_race_state
from ilr_search.analysis.race_core import (
    Evaluation,
    FrontPoint,
    RaceJob,
    RaceSettings,
    RaceState,
    race_lengths,
)

# What callers take from here: the policy's entry point and the types they pass it or read from it (the rest of
# the machinery is in race_core.py, fixed_race.py and adaptive_race.py).
__all__ = [
    "Evaluation",
    "FrontPoint",
    "RaceJob",
    "RaceSettings",
    "RaceState",
    "race_lengths",
    "race_state",
]


def race_state(evaluations: Sequence[Evaluation], settings: RaceSettings, baseline_key: str) -> RaceState:
    """The race's decision from every stored evaluation, by the settings' policy."""
    if settings.policy == "adaptive":
        return adaptive_race_state(evaluations, settings, baseline_key)
    return fixed_race_state(evaluations, settings, baseline_key)
