"""Maps (and knob settings) a trial proposes: the sampler's per-layer counts (family `ilr`) or block (family
`blocks`) repaired into the FLOP budget, and the first maps a study tries.

A trial's parameters: r0..r{L-1} (family ilr); block_start, block_end, block_repeats (family blocks: layers
block_start..block_end, counted from 0, run block_repeats times as a block; block_repeats 1 is the baseline);
and `family` (ilr | blocks) only where a study searches both. The map key of either goes through
training.schedule.Map.parse (a block of one layer is keyed as its per-layer map)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import optuna

from ilr_search.config import MAP_PARTS, TRIAL_FAMILIES
from ilr_search.errors import UserInputError
from ilr_search.knobs import KNOB_CHOICES, KnobValue, knob_choices
from ilr_search.training.flops import PassCosts
from ilr_search.training.mergekit import is_config_path, read_passthrough
from ilr_search.training.schedule import Map, check_max_reuse, key_text, parse_keyed_map

FAMILY_PARAM = "family"  # the trial's family, a parameter only where the study searches both ilr and blocks
BLOCK_START, BLOCK_END, BLOCK_REPEATS = "block_start", "block_end", "block_repeats"
BLOCK_PARAMS = (BLOCK_START, BLOCK_END, BLOCK_REPEATS)
# the part of each layer (p0..p{L-1}) and of a block (block_part), parameters only where a study searches parts
BLOCK_PART = "block_part"
PART_NAMES = {letter: name for name, letter in MAP_PARTS.items()}  # "" -> both, "a" -> attn, "m" -> mlp

# A trial's parameters as Optuna stores them: the counts and a block's indices (int), the family (str) and the
# searched knobs (KnobValue).
TrialParams = dict[str, int | str | KnobValue]


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


def repair_with_costs(reuse_map: Sequence[int], parts: Sequence[str], costs: PassCosts) -> list[int]:
    """repair_to_budget for a map whose extra passes cost what their part costs (a one-branch pass less than a
    layer; adapters more): the extra passes scaled down in proportion to what the budget pays for, then one more to
    each layer in order of its remainder (ties: the larger request, then the earlier layer) while the map fits."""
    if costs.fits(reuse_map, parts):
        return list(reuse_map)
    extras = [r - 1 for r in reuse_map]
    units = [costs.part[parts[i] if parts else ""] for i in range(len(extras))]
    allowed = max(0.0, costs.runs - costs.n_layers)
    scaled = [e * allowed / sum(e * u for e, u in zip(extras, units, strict=True)) for e in extras]
    kept = [math.floor(x) for x in scaled]
    for i in sorted(range(len(extras)), key=lambda i: (-(scaled[i] - kept[i]), -extras[i], i)):
        grown = [k + (j == i) for j, k in enumerate(kept)]
        if kept[i] < extras[i] and costs.fits([1 + k for k in grown], parts):
            kept = grown
    return [1 + k for k in kept]


def fit_map(chosen: Map, costs: PassCosts) -> Map:
    """`chosen` repaired into the budget by what its passes cost (repair_with_costs, repair_block); itself where it
    fits."""
    if costs.fits(chosen.counts, chosen.parts):
        return chosen
    if chosen.is_block:
        fitted = repair_block(
            chosen.start, chosen.end, chosen.repeats, costs.n_layers, 0, costs.part[chosen.part], costs.runs
        )
        return fitted.with_part(chosen.part).canonical()
    return Map.of_counts(repair_with_costs(chosen.counts, chosen.parts, costs), chosen.parts)


def propose_knobs(
    trial: optuna.Trial, names: tuple[str, ...], damping_choices: Sequence[float] = ()
) -> dict[str, KnobValue]:
    """The trial's setting of each searched knob: a categorical dimension named after the knob, over its choices
    (knobs.knob_choices: for damping, the study's damping_choices)."""
    return {
        name: cast(KnobValue, trial.suggest_categorical(name, knob_choices(name, damping_choices))) for name in names
    }


def knobs_off(names: tuple[str, ...]) -> dict[str, KnobValue]:
    return {name: KNOB_CHOICES[name][0] for name in names}


def part_param(layer: int) -> str:
    return f"p{layer}"


def propose_parts(trial: optuna.Trial, n_layers: int, parts: Sequence[str]) -> tuple[str, ...]:
    """Each layer's part (ModelConfig.parts letters), a categorical dimension p{l} over the study's parts beside the
    counts; () where the study searches one part (no parameter: a study of whole layers proposes as before)."""
    if len(parts) < 2:
        return ()
    return tuple(MAP_PARTS[str(trial.suggest_categorical(part_param(i), tuple(parts)))] for i in range(n_layers))


def propose_map(trial: optuna.Trial, n_layers: int, max_reuse: int, max_layer_runs: int) -> tuple[list[int], list[int]]:
    """(proposed, trained) maps of a trial: the sampler's per-layer counts, and the same repaired to the budget.
    The sampler is told how far over budget its proposal was (<= 0: feasible) through a constraint."""
    proposed = [trial.suggest_int(f"r{i}", 1, max_reuse) for i in range(n_layers)]
    trial.set_constraint("budget", float(sum(proposed) - max_layer_runs))
    return proposed, repair_to_budget(proposed, max_layer_runs)


def trial_families(families: Sequence[str]) -> tuple[str, ...]:
    """The families whose maps a study's trials propose (ilr, blocks), in that order."""
    return tuple(f for f in TRIAL_FAMILIES if f in families)


def repair_block(
    start: int,
    end: int,
    repeats: int,
    n_layers: int,
    max_layer_runs: int,
    cost: float = 1.0,
    runs: float | None = None,
) -> Map:
    """The block (layers start..end, in either order, run `repeats` times) made to fit the budget: fewer repeats
    first (down to 2), then a shorter block (from its end, down to one layer); where not even one layer run twice
    fits, the baseline. A block run once is the baseline, written block:0-(L-1):1. Idempotent. With `runs` (the
    budget in layer runs, a fraction), each extra pass of a layer costs `cost` layer runs (a one-branch pass)."""
    start, end = min(start, end), max(start, end)
    # the extra passes of one layer the budget pays for beyond the baseline's
    extra = max_layer_runs - n_layers if runs is None else int(math.floor((runs - n_layers) / cost * (1 + 1e-9)))
    if repeats <= 1 or extra < 1:
        return Map.of_block(0, n_layers - 1, 1, n_layers)
    length = end - start + 1
    fitted = min(repeats, 1 + extra // length)
    if fitted >= 2:
        return Map.of_block(start, end, fitted, n_layers)
    return Map.of_block(start, start + min(length, extra) - 1, 2, n_layers)


def feasible_blocks(
    n_layers: int, max_reuse: int, max_layer_runs: int, part: str = "", costs: PassCosts | None = None
) -> list[Map]:
    """Every block a study of blocks can evaluate: layers start..end (a single layer too) run 2..max_reuse times,
    within the budget's layer runs, by repeats, then start, then end (the grid sampler's scan, in its order); with
    `part` and the budget's `costs`, blocks of that part, each extra pass at its part's cost."""
    return [
        Map.of_block(start, end, repeats, n_layers, part)
        for repeats in range(2, max_reuse + 1)
        for start in range(n_layers)
        for end in range(start, n_layers)
        if (
            n_layers + (end - start + 1) * (repeats - 1) <= max_layer_runs
            if costs is None
            else costs.fits(Map.of_block(start, end, repeats, n_layers).counts, (part,) * n_layers)
        )
    ]


def block_params(block: Map, parts: Sequence[str] = ()) -> TrialParams:
    """A block's trial parameters; with the study's `parts` (two or more), its part too."""
    params: TrialParams = {BLOCK_START: block.start, BLOCK_END: block.end, BLOCK_REPEATS: block.repeats}
    return params | ({BLOCK_PART: PART_NAMES[block.part]} if len(parts) > 1 else {})


def propose_block(trial: optuna.Trial, n_layers: int, max_reuse: int, max_layer_runs: int) -> tuple[Map, Map]:
    """(proposed, trained) blocks of a trial: the sampler's block (no prior on where it lies), and the same repaired
    to the budget (repair_block). The sampler is told how far over budget its proposal was, as for counts."""
    start = trial.suggest_int(BLOCK_START, 0, n_layers - 1)
    end = trial.suggest_int(BLOCK_END, 0, n_layers - 1)
    repeats = trial.suggest_int(BLOCK_REPEATS, 1, max_reuse)
    proposed = Map.of_block(min(start, end), max(start, end), repeats, n_layers)
    trial.set_constraint("budget", float(proposed.layer_runs - max_layer_runs))
    return proposed, repair_block(start, end, repeats, n_layers, max_layer_runs)


def propose_trial_map(
    trial: optuna.Trial,
    n_layers: int,
    max_reuse: int,
    max_layer_runs: int,
    families: Sequence[str],
    parts: Sequence[str] = ("both",),
    costs: PassCosts | None = None,
    by_costs: bool = False,
) -> tuple[Map, tuple[int, ...] | None]:
    """The map a trial trains (canonical: Map.parse's form) and, where the budget repaired the sampler's proposal,
    the proposal's per-layer counts. A study searching ilr alone proposes exactly as propose_map; with `parts` (two
    or more), or `by_costs` (a routed trial, whose passes cost less than a layer), each repeated layer's (or the
    block's) part beside its count, repaired into the budget by what its passes cost (`costs`, the budget's
    pass_costs)."""
    kinds = trial_families(families)
    family = trial.suggest_categorical(FAMILY_PARAM, kinds) if len(kinds) > 1 else kinds[0]
    if family == "ilr" and (costs is None or (len(parts) < 2 and not by_costs)):
        proposed, reuse_map = propose_map(trial, n_layers, max_reuse, max_layer_runs)
        return Map.of_counts(reuse_map), (tuple(proposed) if proposed != reuse_map else None)
    if family == "ilr":
        assert costs is not None
        proposed = [trial.suggest_int(f"r{i}", 1, max_reuse) for i in range(n_layers)]
        chosen_parts = propose_parts(trial, n_layers, parts)
        trial.set_constraint("budget", float(costs.spent(proposed, chosen_parts) - costs.runs))
        reuse_map = repair_with_costs(proposed, chosen_parts, costs)
        return Map.of_counts(reuse_map, chosen_parts), (tuple(proposed) if proposed != reuse_map else None)
    asked, block = propose_block(trial, n_layers, max_reuse, max_layer_runs)
    part = MAP_PARTS[str(trial.suggest_categorical(BLOCK_PART, tuple(parts)))] if len(parts) > 1 else ""
    if part and costs is not None:  # the block repaired by what its part's passes cost
        asked = asked.with_part(part)
        fitted = fit_map(asked, costs)
        return fitted, (asked.counts if fitted != asked else None)
    return block.with_part(part).canonical(), (asked.counts if asked != block else None)


def family_params(family: str, families: Sequence[str]) -> TrialParams:
    """The `family` parameter of a trial of `family`, where the study searches more than one."""
    return {FAMILY_PARAM: family} if len(trial_families(families)) > 1 else {}


def first_params(
    n_layers: int,
    max_reuse: int,
    max_layer_runs: int,
    families: Sequence[str],
    scan: bool = False,
    parts: Sequence[str] = ("both",),
    costs: PassCosts | None = None,
) -> list[TrialParams]:
    """The parameters of a study's first maps, baseline first: first_maps where the study searches ilr, else the
    baseline as a block run once (no prior on where to loop); `scan` (the grid sampler over blocks): then every
    feasible block (feasible_blocks), in each of the study's `parts`. The first maps repeat whole layers."""
    baseline = Map.of_block(0, n_layers - 1, 1, n_layers)
    if scan:
        parted = [
            b
            for p in parts
            for b in feasible_blocks(n_layers, max_reuse, max_layer_runs, MAP_PARTS[p], costs if MAP_PARTS[p] else None)
        ]
        return [block_params(b, parts) for b in [baseline, *parted]]
    if "ilr" in trial_families(families):
        return [
            {**map_params(m, (), parts), **family_params("ilr", families)}
            for m in first_maps(n_layers, max_reuse, max_layer_runs)
        ]
    return [{**block_params(baseline, parts), **family_params("blocks", families)}]


def first_maps(n_layers: int, max_reuse: int, max_layer_runs: int) -> list[list[int]]:
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
    map_params: TrialParams = field(default_factory=dict)  # the map's trial parameters (family included)

    def params(self, searched_knobs: Sequence[str]) -> dict[str, int | str | KnobValue]:
        """The trial's parameters: the map's (one count per layer, or the block; parts where searched), and every
        searched knob (off unless set)."""
        return self.map_params | knobs_off(tuple(searched_knobs)) | self.knobs


def map_params(reuse_map: Sequence[int], parts: Sequence[str] = (), searched: Sequence[str] = ("both",)) -> TrialParams:
    """A reuse map's trial parameters: r{l} per layer, and where the study searches parts (`searched`, two or
    more), p{l} per layer (a part's name, `both` where the layer is whole)."""
    params: TrialParams = {f"r{i}": int(r) for i, r in enumerate(reuse_map)}
    if len(searched) > 1:
        params |= {part_param(i): PART_NAMES[parts[i] if parts else ""] for i in range(len(reuse_map))}
    return params


def parse_enqueued(
    text: str,
    n_layers: int,
    max_reuse: int,
    max_layer_runs: int,
    searched_knobs: Sequence[str],
    families: Sequence[str] = ("ilr", "block"),
    parts: Sequence[str] = ("both",),
    costs: PassCosts | None = None,
    costs_for: Callable[[Mapping[str, KnobValue]], PassCosts] | None = None,
) -> EnqueuedMap:
    """One entry of an enqueue list: `3,2,2,1`, `2,1,1,1|injection=add` (knobs as `train --knobs` takes them),
    `block:1-2:2` (where the study searches blocks), `block2`, or a mergekit passthrough config (a path ending .yml
    or .yaml, read by training.mergekit.read_passthrough into its map key with knobs, e.g.
    block:16-27:2|damping=0.5). An over-budget map is repaired to the budget (a routed one, `capacity` below 1, by
    what its passes cost at its capacity: `costs_for` its knobs); a malformed one (wrong length, a count below 1 or
    above max_reuse, a knob the study does not search, a block the budget cannot pay for, a map of
    a family the study does not search) is refused. Where the study searches blocks, `blockK` is the block map
    block:0-(L-1):K, a trial (not a reference run: one schedule is trained once)."""
    entry = text.strip()
    where = f"enqueued map {entry!r}"
    if is_config_path(entry):  # a mergekit passthrough config: the map (and damping) its slices build
        entry = read_passthrough(Path(entry), n_layers).key
        where = f"enqueued mergekit config {text.strip()!r} ({entry})"
    kinds = trial_families(families)
    keyed = parse_keyed_map(entry, n_layers, where)
    chosen, knobs = keyed.with_knobs(""), keyed.knob_settings
    if chosen.is_stack:
        k = chosen.repeats
        if k < 2:
            raise UserInputError(f"{where}: block recurrence needs K >= 2 (block1 is the baseline 1,...,1)")
        if n_layers * k > max_layer_runs:
            raise UserInputError(f"{where}: {n_layers * k} layer runs exceed the budget's {max_layer_runs}")
        if "blocks" not in kinds:
            if knobs:
                raise UserInputError(f"{where}: block recurrence blockK is a reference run, with every knob off")
            return EnqueuedMap(entry, block=k)
        chosen = Map.of_block(0, n_layers - 1, k, n_layers)
        entry = key_text(chosen.text, keyed.knobs)
    check_max_reuse(chosen.counts, max_reuse, where)
    if not chosen.is_block and "ilr" not in kinds:
        as_block = chosen.one_block()
        if as_block is None:
            raise UserInputError(
                f"{where}: this study searches block maps only ([search] families "
                f"{list(families)}); write a block map block:I-J:R, or add 'ilr' to the families"
            )
        chosen = as_block
    if chosen.is_block and "blocks" not in kinds:
        raise UserInputError(
            f"{where}: block maps are searched only where [search] families includes 'blocks' "
            f"(this study's: {list(families)})"
        )
    unsearched_parts = sorted({PART_NAMES[p] for p in chosen.parts if p} - set(parts))
    if unsearched_parts:
        raise UserInputError(
            f"{where}: part(s) {', '.join(unsearched_parts)} are not searched by this study (searched: "
            f"{', '.join(parts)}); add them to --parts or [search] parts"
        )
    unsearched = sorted(set(knobs) - set(searched_knobs))
    if unsearched:
        searched = ", ".join(searched_knobs) or "none"
        raise UserInputError(
            f"{where}: knob(s) {', '.join(unsearched)} are not searched by this study (searched: "
            f"{searched}); add them to --knobs or [search] knobs"
        )
    if chosen.is_block:  # a block of one part: each extra pass at its part's cost
        cost, runs = (costs.part[chosen.part], costs.runs) if chosen.part and costs is not None else (1.0, None)
        fitted = repair_block(chosen.start, chosen.end, chosen.repeats, n_layers, max_layer_runs, cost, runs)
        fitted = fitted.with_part(chosen.part)
        return EnqueuedMap(
            entry,
            fitted.counts,
            knobs,
            None,
            None if fitted == chosen else chosen.counts,
            block_params(fitted, parts) | family_params("blocks", families),
        )
    reuse_map = list(chosen.counts)
    routed = costs_for is not None and float(knobs.get("capacity", 1.0)) < 1
    if routed and costs_for is not None:  # a routed pass costs about C of a layer: repaired at its own costs
        costs = costs_for(knobs)
    if (chosen.parts or routed) and costs is not None:  # each extra pass at its part's cost
        repaired = repair_with_costs(reuse_map, chosen.parts, costs)
    else:
        repaired = repair_to_budget(reuse_map, max_layer_runs)
    return EnqueuedMap(
        entry,
        tuple(repaired),
        knobs,
        None,
        None if repaired == reuse_map else tuple(reuse_map),
        map_params(repaired, chosen.parts, parts) | family_params("ilr", families),
    )


def split_enqueue_text(text: str) -> list[str]:
    """`--enqueue "3,2,2,1 4,2,1,1|injection=add block2"`: entries separated by spaces (or semicolons)."""
    return [part for part in re.split(r"[\s;]+", text) if part]
