"""Replaying a pruning rule over a bench table's rows: the maps it prunes, the steps it saves, the front maps it
loses (`ilr-search bench replay`)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ilr_search.commands.bench.table import Table
from ilr_search.config import PRUNERS, PrunerSettings
from ilr_search.errors import UserInputError
from ilr_search.search.pruners import decision_at_rung, pruner_settings
from ilr_search.space import load_space
from ilr_search.storage import CurvePoint


@dataclass(frozen=True)
class PrunedMap:
    """A map the rule pruned: its key, the step it was pruned at and its FLOPs ratio."""

    reuse_map: str
    step: int
    flops_ratio: float


@dataclass
class PruningReplay:
    """A pruning rule replayed over a table's rows, in table order or shuffled."""

    rule: str
    order_seed: int | None
    rungs: tuple[int, ...]
    n_rows: int
    pruned: list[PrunedMap]
    steps_trained: int
    steps_saved: int
    front: list[str]  # the table's own final front
    front_maps_lost: list[str]

    @property
    def steps_saved_share(self) -> float:
        total = self.steps_trained + self.steps_saved
        return self.steps_saved / total if total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"steps_saved_share": self.steps_saved_share}


def replay_pruning(
    table: Table,
    settings: PrunerSettings,
    order_seed: int | None = None,
    rung_fractions: Sequence[float] = (0.125, 0.25, 0.5),
) -> PruningReplay:
    """Feed every row of the table through the pruning rule, one map after another (table order, or shuffled
    by `order_seed`), and count the steps it saves and the table's front maps it loses."""
    settings = dataclasses.replace(settings, rungs=table.rungs_at(rung_fractions))
    rows = list(table.rows)
    if order_seed is not None:
        random.Random(order_seed).shuffle(rows)
    points: list[CurvePoint] = []
    pruned, trained, saved = [], 0, 0
    for number, row in enumerate(rows):
        step = feed_curve(
            number,
            row.map_key,
            row.flops_ratio,
            row.curve,
            table.steps,
            points,
            None if settings.name == "none" else settings,
        )
        if step is None:
            trained += table.steps
        else:
            pruned.append(PrunedMap(row.map_key, step, row.flops_ratio))
            trained += step
            saved += table.steps - step
    front = table.front_keys()
    lost = [p.reuse_map for p in pruned if p.reuse_map in front]
    return PruningReplay(settings.name, order_seed, settings.rungs, len(rows), pruned, trained, saved, front, lost)


def feed_curve(
    number: int,
    map_key: str,
    ratio: float,
    curve: dict[int, float],
    final_step: int,
    points: list[CurvePoint],
    settings: PrunerSettings | None,
) -> int | None:
    """Feed a map's curve point by point, as a live trial records it, into `points`; the step where the rule
    prunes it, or None if it runs to the end (or there is no rule)."""
    for step in sorted(s for s in curve if s <= final_step):
        me = CurvePoint(number, step, curve[step], ratio, map_key)
        points.append(me)
        if (
            settings is not None
            and step in settings.rungs
            and not decision_at_rung(me, points, final_step, settings).keep
        ):
            return step
    return None


def default_pruner_settings(pruner: str) -> PrunerSettings:
    """A pruning rule with the default space's settings (what a default study prunes with)."""
    if pruner not in PRUNERS:
        raise ValueError(f"unknown pruner {pruner!r}; use one of {', '.join(PRUNERS)}")
    space = load_space()
    return pruner_settings(dataclasses.replace(space, search=dataclasses.replace(space.search, pruner=pruner)))


@dataclass(frozen=True)
class TableReplay:
    """`ilr-search bench replay`: a pruning rule replayed over the bench table at `table` (its proxies `steps`
    long). to_json is its --json."""

    table: str
    steps: int
    replay: PruningReplay

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "steps": self.steps, **self.replay.to_dict()}


def replay_table(path: str | Path, pruner: str = "pareto", order_seed: int | None = None) -> TableReplay:
    """`ilr-search bench replay`: one pruning rule (with the default space's settings) over a table's rows."""
    if pruner not in ("pareto", "pareto-eager", "none"):
        raise UserInputError(f"unknown --pruner {pruner!r} for a replay; use pareto, pareto-eager or none")
    table = Table.read(path)
    result = replay_pruning(table, default_pruner_settings(pruner), order_seed)
    return TableReplay(str(path), table.steps, result)
