"""Racing reuse maps across seeds and training lengths: a pure policy over stored evaluations.

Every evaluation of a map is one (map, steps, seed) result. The policy reads all of them and says which
contenders are still open, which jobs to train next (more seeds, then longer training), which maps are
eliminated (a paired test shows a map at no more FLOPs better at the current length), and what the front at
the target length is, with intervals and whether each point is confirmed. It keeps no state of its own:
the same evaluations give the same decision, so a resumed study, a second worker and `bench replay` agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Evaluation:
    """One trained result: map `map_key` trained for `steps` steps at `seed`; val_loss None when it diverged."""
    map_key: str
    flops_ratio: float
    steps: int
    seed: int
    val_loss: float | None


@dataclass(frozen=True)
class RaceJob:
    """A result the race still needs: train `map_key` for `steps` steps at `seed`."""
    map_key: str
    steps: int
    seed: int


@dataclass(frozen=True)
class RaceSettings:
    """base_steps: the proxy's length (every map's first result); target_steps: the length the verdict is
    about; lengths in between are doubled from base_steps. seeds: the seeds a contender is raced on, first
    at the base length. confidence: of the paired tests and the intervals (two-sided)."""
    base_steps: int
    target_steps: int
    seeds: tuple[int, ...] = (0, 1, 2)
    confidence: float = 0.9
    max_contenders: int = 6


@dataclass(frozen=True)
class FrontPoint:
    """A front point at its longest raced length: the mean over its seeds, with an interval (low, high ppl)."""
    map_key: str
    flops_ratio: float
    steps: int
    seeds: tuple[int, ...]
    val_ppl: float
    interval: tuple[float, float]
    confirmed: bool


@dataclass(frozen=True)
class RaceState:
    alive: tuple[str, ...]
    eliminated: dict[str, str] = field(default_factory=dict)  # map_key -> why (the test that eliminated it)
    next_jobs: tuple[RaceJob, ...] = ()
    front: tuple[FrontPoint, ...] = ()
    verdict: str = ""
    done: bool = False


def race_state(evaluations: Sequence[Evaluation], settings: RaceSettings, baseline_key: str) -> RaceState:
    """The race's decision from every stored evaluation (see the module docstring)."""
    raise NotImplementedError
