"""Reuse maps (and knob settings) a trial proposes: the sampler's counts repaired into the FLOP budget, and the
first maps a study tries."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import optuna

from ilr_search.errors import UserInputError
from ilr_search.knobs import KNOB_CHOICES, KnobValue, parse_knob_settings
from ilr_search.training.schedule import check_max_reuse, parse_reuse_map


def repair_to_budget(reuse_map: list[int], max_layer_runs: int) -> list[int]:
    """The map scaled into the budget, keeping its shape: the extra iterations (r - 1) are scaled down in
    proportion and the iterations left over go to the largest remainders (ties: the larger request, then the
    earlier layer). Every layer keeps at least one run; a map within budget is returned unchanged."""
    extras = [r - 1 for r in reuse_map]
    allowed = max(0, max_layer_runs - len(reuse_map))
    total = sum(extras)
    if total <= allowed:
        return list(reuse_map)
    scaled = [e * allowed / total for e in extras]
    kept = [math.floor(x) for x in scaled]
    leftover = allowed - sum(kept)
    order = sorted(range(len(extras)), key=lambda i: (-(scaled[i] - kept[i]), -extras[i], i))
    for i in order[:leftover]:
        kept[i] += 1
    return [1 + e for e in kept]


def propose_knobs(trial: optuna.Trial, names: tuple[str, ...]) -> dict[str, KnobValue]:
    """The trial's setting of each searched knob: a categorical dimension named after the knob."""
    return {name: trial.suggest_categorical(name, KNOB_CHOICES[name]) for name in names}


def knobs_off(names: tuple[str, ...]) -> dict[str, KnobValue]:
    return {name: KNOB_CHOICES[name][0] for name in names}


def propose_map(trial: optuna.Trial, n_layers: int, max_reuse: int, max_layer_runs: int) -> tuple[list[int], list[int]]:
    """(proposed, trained) maps of a trial: the sampler's per-layer counts, and the same repaired to the budget.
    The sampler is told how far over budget its proposal was (<= 0: feasible) through a constraint."""
    proposed = [trial.suggest_int(f"r{i}", 1, max_reuse) for i in range(n_layers)]
    trial.set_constraint("budget", float(sum(proposed) - max_layer_runs))
    return proposed, repair_to_budget(proposed, max_layer_runs)


def seed_maps(n_layers: int, max_reuse: int, max_layer_runs: int) -> list[list[int]]:
    """The all-ones baseline and front-loaded maps in the spirit of the paper's findings ([4,2,1,1], [3,2,2,1]
    and [2,1,1,1] were its best small-model maps), repaired to the budget, without duplicates."""
    ones = [1] * n_layers
    shapes = [[2], [4, 2], [3, 2, 2], [2, 2]]
    maps, seen = [ones], {tuple(ones)}
    for head in shapes:
        m = [min(max_reuse, r) for r in head[:n_layers]] + [1] * max(0, n_layers - len(head))
        m = repair_to_budget(m, max_layer_runs)
        if tuple(m) not in seen:
            seen.add(tuple(m))
            maps.append(m)
    return maps


@dataclass(frozen=True)
class EnqueuedMap:
    """A map a person asked to have trained first (`run --enqueue`, `[search] enqueue`): a reuse map with its knob
    settings (the searched knobs it does not name are off), or block recurrence K (`block`, trained as a reference
    run: block recurrence is not a point of the map sampler's space)."""
    text: str  # as written
    reuse_map: tuple[int, ...] = ()  # repaired to the budget
    knobs: dict[str, KnobValue] = field(default_factory=dict)
    block: int | None = None
    repaired_from: tuple[int, ...] | None = None  # the map as written, where it was over budget

    def params(self, searched_knobs: Sequence[str]) -> dict[str, int | KnobValue]:
        """The trial's parameters: one count per layer, and every searched knob (off unless set)."""
        return map_params(self.reuse_map) | knobs_off(tuple(searched_knobs)) | self.knobs


def map_params(reuse_map: Sequence[int]) -> dict[str, int]:
    return {f"r{i}": int(r) for i, r in enumerate(reuse_map)}


BLOCK_ENTRY = re.compile(r"block(\d+)")


def parse_enqueued(text: str, n_layers: int, max_reuse: int, max_layer_runs: int,
                   searched_knobs: Sequence[str]) -> EnqueuedMap:
    """One entry of an enqueue list: `3,2,2,1`, `2,1,1,1|injection=add` (knobs as `train --knobs` takes them) or
    `block2`. An over-budget map is repaired to the budget; a malformed one (wrong length, a count below 1 or
    above max_reuse, a knob the study does not search, a block the budget cannot pay for) is refused."""
    entry = text.strip()
    where = f"enqueued map {entry!r}"
    block = BLOCK_ENTRY.fullmatch(entry)
    if block:
        k = int(block.group(1))
        if k < 2:
            raise UserInputError(f"{where}: block recurrence needs K >= 2 (block1 is the baseline 1,...,1)")
        if n_layers * k > max_layer_runs:
            raise UserInputError(f"{where}: {n_layers * k} layer runs exceed the budget's {max_layer_runs}")
        return EnqueuedMap(entry, block=k)
    map_text, _, knob_text = entry.partition("|")
    try:
        reuse_map = parse_reuse_map(map_text, n_layers)
        knobs = parse_knob_settings(knob_text) if knob_text.strip() else {}
    except ValueError as e:  # ScheduleError is a UserInputError; knob errors are ValueErrors
        raise UserInputError(f"{where}: {e}") from None
    check_max_reuse(reuse_map, max_reuse, where)
    unsearched = sorted(set(knobs) - set(searched_knobs))
    if unsearched:
        searched = ", ".join(searched_knobs) or "none"
        raise UserInputError(f"{where}: knob(s) {', '.join(unsearched)} are not searched by this study (searched: "
                             f"{searched}); add them to --knobs or [search] knobs")
    repaired = repair_to_budget(reuse_map, max_layer_runs)
    return EnqueuedMap(entry, tuple(repaired), knobs, None, None if repaired == reuse_map else tuple(reuse_map))


def split_enqueue_text(text: str) -> list[str]:
    """`--enqueue "3,2,2,1 4,2,1,1|injection=add block2"`: entries separated by spaces (or semicolons)."""
    return [part for part in re.split(r"[\s;]+", text) if part]

