"""What a study's race says and what it rests on, as one typed record: the race's settings, every stored result
with its fidelity, the policy's state (comparisons, verdict, detectable gap), the equal-compute comparison, the
decided front and the answer. search/race.py builds it; the CLI, the figure (plots.py) and the reports read it;
`to_json` is its one JSON form (the `race` object of `run --json`, `pareto --json` and `trials --json`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ilr_search.analysis.answer import Answer
from ilr_search.analysis.race_core import DetectableGap, EqualCompute, RaceSettings, RaceState, result_dict
from ilr_search.analysis.results import FrontRow
from ilr_search.storage.store import Run


@dataclass(frozen=True)
class DecidedBest:
    """The map the race reports (search/race.py decided_best): claimed better than the baseline
    (`beats_baseline`), or else the baseline; whether the race is `done`; its front row's perplexity, length and
    seeds (None where the front has no row of it)."""

    map: str
    beats_baseline: bool
    done: bool
    val_ppl: float | None
    steps: int | None
    seeds: tuple[int, ...] | None


@dataclass(frozen=True)
class RaceReport:
    """settings: the race's; results: every stored result of the study (trials, reference runs, race runs: each
    race_core.race_result), one per (map, steps, seed); state: the policy's decision on them; front: the decided
    front as its JSON items (each point at its longest raced length, with seeds, interval and confirmation:
    race.front_rows); best: the map the race reports (race.decided_best); equal_compute: the equal-compute
    comparison with parameter counts; answer: the answer line and its details; schedule: the learning-rate
    schedule every run was trained with (race_results.lr_schedule)."""

    settings: RaceSettings
    results: tuple[Run, ...]
    state: RaceState
    front: tuple[FrontRow, ...]
    best: DecidedBest | None
    equal_compute: EqualCompute | None
    answer: Answer
    schedule: str

    @property
    def verdict(self) -> str:
        return self.state.verdict

    @property
    def detectable_gap(self) -> DetectableGap | None:
        return self.state.detectable_gap

    @property
    def target_steps(self) -> int:
        return self.settings.target_steps

    @property
    def steps_trained(self) -> int:
        """Steps of the race runs (the race's and the audit's), beyond the trials and reference runs."""
        return sum(r.steps for r in self.runs)

    @property
    def runs(self) -> tuple[Run, ...]:
        """The race runs (the race's and the audit's) of its results."""
        return tuple(r for r in self.results if r.kind == "race")

    @property
    def trial_maps(self) -> frozenset[str]:
        """The maps a trial trained to a result (the maps the race may raise to contenders)."""
        return frozenset(r.map_key for r in self.results if r.kind == "trial")

    def to_json(self) -> dict[str, Any]:
        """The `race` object of the JSON reports."""
        s, state = self.settings, self.state
        frozen = {"frozen": True} if s.frozen else {}  # only a frozen study's race says so
        return frozen | {
            "policy": s.policy,
            "base_steps": s.base_steps,
            "target_steps": s.target_steps,
            "steps_trained": self.steps_trained,
            "compute_steps": state.compute_steps,
            "max_steps": s.max_steps,
            "seeds": list(s.seeds),
            "confidence": s.confidence,
            "done": state.done,
            "stopped": state.stopped,
            "alive": list(state.alive),
            "eliminated": dict(state.eliminated),
            "comparisons": [c.to_dict() for c in state.comparisons],
            "screen": state.screen.to_dict() if state.screen is not None else {},
            "detectable_gap": state.detectable_gap.to_dict() if state.detectable_gap is not None else None,
            "equal_compute": self.equal_compute.to_dict() if self.equal_compute is not None else None,
            "results": [
                result_dict(r, self.schedule) for r in sorted(self.results, key=lambda r: (r.map_key, r.steps, r.seed))
            ],
        }
