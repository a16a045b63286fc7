"""`run --learn`: a map learned instead of proposed. One model is trained at the widest schedule with a gate on every
extra pass (training/learned.py), the map is read off its gates, and that map is enqueued as a trial of the study, so
that the pruner, the front and the race see it as any other map; `--n-trials 0` races it against the plain model
alone. What learning gave (the gates per layer and pass, the map, what it cost) is stored with the study
(LEARNED_ATTR), so a resume, or a worker process, reads it instead of learning again.

The read-off rule: a pass is kept where its effective gate is >= 0.5, the dropped passes removed, and a map over the
budget drops its lowest-gated kept passes until it fits (LearnedGates.counts). Where the study searches damping, the
kept passes' mean gate becomes the map's damping, the nearest of the study's damping_choices (one damping a map,
a categorical dimension of the study); else the kept gates are dropped to 1, the plain repeat.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ilr_search.config import SpaceConfig, scored_by_item
from ilr_search.errors import UserInputError
from ilr_search.knobs import config_key
from ilr_search.search.plan import StudyPlan
from ilr_search.storage.trials import TrialRecord
from ilr_search.training.schedule import Map

if TYPE_CHECKING:  # torch loads only where a map is learned: `studies` and `--help` read reports without it
    from ilr_search.training.frozen import EvalData

LEARNED_ATTR = "learned_schedule"  # the study's user attribute holding learned_schedule's record


def check_learnable(space: SpaceConfig) -> None:
    """`--learn` is refused, in one line, where it cannot serve the study: gates are learned on per-layer passes (the
    ilr family), from an LM loss (not task items), for a sampler that does not evaluate every map anyway."""
    search = space.search
    if "ilr" not in search.families:
        raise UserInputError(
            f"--learn learns per-layer reuse maps (family ilr); this study searches {list(search.families)}: add "
            "'ilr' to [search] families, or drop --learn"
        )
    if search.sampler == "grid":
        raise UserInputError("--learn with --sampler grid: the grid evaluates every feasible map anyway; drop one")
    if scored_by_item(search.objective, space.train.steps):
        raise UserInputError(
            f"--learn learns its gates from the loss of held-out text, not from task items (--objective "
            f"{search.objective}, frozen); use --objective pareto or ppl, or drop --learn"
        )


def learned_schedule(plan: StudyPlan, data: EvalData, stored: Mapping[str, Any]) -> dict[str, Any]:
    """The study's learned map and how it was learned: the one stored with it, else learned now (module docstring).
    `map` is the map with its knobs as `--enqueue` takes it."""
    from ilr_search.training.learned import KEEP_AT, learn_gates

    if LEARNED_ATTR in stored:
        return dict(stored[LEARNED_ATTR])
    search = plan.space.search
    train = dataclasses.replace(plan.space.train, dtype=plan.dtype)
    learned = learn_gates(plan.trial_model({}), data, train, plan.budget.ratio, search.max_reuse)
    counts = learned.counts(plan.budget.max_layer_runs(plan.model))
    kept = learned.kept_gates(counts)
    damping = None
    if "damping" in search.knobs and kept:
        mean = sum(kept) / len(kept)
        damping = min(search.damping_choices, key=lambda a: (abs(a - mean), -a))
    text = Map.of_counts(counts).key + (f"|damping={damping:g}" if damping is not None and damping != 1.0 else "")
    return {
        "map": text,
        "gates": [list(row) for row in learned.gates],
        "kept_at": KEEP_AT,
        "damping": damping,
        "expected_flops_ratio": learned.expected_ratio,
        "budget_ratio": learned.budget_ratio,
        "shift": learned.shift,
        "steps": learned.steps,
        "seconds": learned.seconds,
        "frozen": learned.frozen,
    }


def learned_record(attrs: Mapping[str, Any], trials: Sequence[TrialRecord]) -> dict[str, Any] | None:
    """The study's learned map as reports show it, with `trial`, the number of the trial that trained it (None
    before one has)."""
    if LEARNED_ATTR not in attrs:
        return None
    learned = dict(attrs[LEARNED_ATTR])
    numbers = [t.number for t in trials if t.map_key and config_key(t.map_key, t.knobs) == learned["map"]]
    return learned | {"trial": numbers[0] if numbers else None}


def learned_line(learned: Mapping[str, Any]) -> str:
    """One line: the learned map and what learning cost."""
    how = "the gates alone, on the select windows (frozen)" if learned["frozen"] else "the gates with the weights"
    return (
        f"learned map {learned['map']}: one model at the widest schedule, {how}, {learned['steps']} steps in "
        f"{learned['seconds']:.1f} s; expected FLOPs {learned['expected_flops_ratio']:.3f}x (budget "
        f"{learned['budget_ratio']:.3f}x), the budget's logit shift {learned['shift']:.3g}"
    )
