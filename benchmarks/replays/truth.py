"""Truth tables: one result per (map, steps, seed), several lengths and seeds of every map (benchmarks/truth.py
builds them), against which the race and the one-seed rules are replayed (policy.py) and their power measured
(power.py)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from ilr_search.analysis.racing import Evaluation
from ilr_search.commands.bench.table import Table, TableRow, read_frame
from ilr_search.errors import UserInputError
from ilr_search.training.schedule import Map


@dataclass(frozen=True)
class TruthTable:
    """One result per (map, steps, seed), as benchmarks/truth.py writes them (its docstring has the schema):
    val_loss None where the run diverged; curves (step -> val_loss) by (map, steps, seed)."""

    baseline: str
    flops: dict[str, float]
    losses: dict[tuple[str, int, int], float | None]
    curves: dict[tuple[str, int, int], dict[int, float]]
    n_layers: int
    max_reuse: int

    @classmethod
    def read(cls, path: str | Path) -> TruthTable:
        frame = read_frame(
            path,
            "truth table",
            {"map_key", "flops_ratio", "steps", "seed", "val_loss"},
            " (benchmarks/truth.py writes one)",
        )
        flops, losses, curves = {}, {}, {}
        for r in frame.to_dict("records"):
            key = (str(r["map_key"]), int(r["steps"]), int(r["seed"]))
            flops[key[0]] = float(r["flops_ratio"])
            loss = float(r["val_loss"])
            losses[key] = loss if math.isfinite(loss) else None
            if "curve" in r and isinstance(r["curve"], str):
                curves[key] = {int(st): float(v) for st, v in json.loads(r["curve"])}
        meta = json.loads(frame["meta"].iloc[0]) if "meta" in frame.columns else {}
        maps = [Map.parse(k).counts for k in flops]
        baseline = str(meta.get("baseline") or min(flops, key=lambda k: (flops[k], k)))
        return cls(baseline, flops, losses, curves, len(maps[0]), max(max(m) for m in maps))

    def first_seeds(self, n: int) -> TruthTable:
        """The table with only its first n seeds (a smaller table of the same maps: the noise of fewer seeds)."""
        keep = set(sorted({s for (_, _, s) in self.losses})[:n])
        return dataclasses.replace(
            self,
            losses={k: v for k, v in self.losses.items() if k[2] in keep},
            curves={k: v for k, v in self.curves.items() if k[2] in keep},
        )

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(sorted({steps for _, steps, _ in self.losses}))

    def seeds_at(self, steps: int) -> tuple[int, ...]:
        """The seeds every map has at `steps` (the seeds a replayed race can be answered at)."""
        per_map = [{s for (k, st, s) in self.losses if k == key and st == steps} for key in self.flops]
        return tuple(sorted(set.intersection(*per_map))) if per_map else ()

    def seed_mean(self, key: str, steps: int) -> float | None:
        """The table's truth for a map: its mean loss over every seed the table has at `steps`."""
        values = [v for (k, st, _), v in self.losses.items() if k == key and st == steps]
        known = [v for v in values if v is not None]
        if not values or len(known) < len(values):
            return None
        return math.fsum(known) / len(known)

    def seed_sd(self, steps: int) -> float:
        """The pooled seed standard deviation of the loss at `steps` (root mean of the maps' variances)."""
        import statistics

        variances = []
        for key in self.flops:
            values = [v for (k, st, _), v in self.losses.items() if k == key and st == steps and v is not None]
            if len(values) >= 2:
                variances.append(statistics.variance(values))
        return math.sqrt(math.fsum(variances) / len(variances)) if variances else math.nan

    def evaluation(self, key: str, steps: int, seed: int) -> Evaluation | None:
        if (key, steps, seed) not in self.losses:
            return None
        return Evaluation(key, self.flops[key], steps, seed, self.losses[(key, steps, seed)])

    def bench_table(self, steps: int, seed: int) -> Table:
        """The maps at one length and seed as a bench table (for today's rule: one seed, pruned on its curve)."""
        rows = tuple(
            TableRow(
                k,
                Map.parse(k).counts,
                self.flops[k],
                math.exp(cast(float, self.losses[(k, steps, seed)])),  # a bench table's seed has every loss
                self.curves.get((k, steps, seed), {}),
            )
            for k in sorted(self.flops)
            if self.losses.get((k, steps, seed)) is not None
        )
        rungs = tuple(sorted({st for r in rows for st in r.curve if st < steps}))
        return Table(self.n_layers, self.max_reuse, max(sum(r.reuse_map or ()) for r in rows), steps, rungs, rows)


def planted(
    table: TruthTable, map_key: str, delta: float, crossing: bool = False, against: str = "baseline"
) -> TruthTable:
    """The table with `map_key` made truly better than the baseline by `delta` nats: at each length its mean over
    the table's seeds becomes the baseline's mean there minus the gap, and each seed keeps its own deviation from
    the map's mean (its own noise). The gap is `delta` at every length, or with `crossing` -delta at the base
    length (worse than the baseline), +delta at the target and in between linear in log-steps. Its curves move
    with its final results. against="best": the gap is to the table's best mean at the target instead (where
    recurrent maps already beat the baseline, the planted map becomes the best by `delta` there)."""
    if map_key not in table.flops or map_key == table.baseline:
        raise UserInputError(f"cannot plant a gap in {map_key!r}: it is the baseline or not in the table")
    lengths = table.lengths
    span = math.log(lengths[-1] / lengths[0]) if len(lengths) > 1 else 1.0

    lead = 0.0
    if against == "best":
        means = [m for k in table.flops if (m := table.seed_mean(k, lengths[-1])) is not None]
        base = table.seed_mean(table.baseline, lengths[-1])
        if base is None:
            raise UserInputError(f"the table has no baseline result at its longest length, {lengths[-1]} steps")
        lead = base - min(means)

    def gap(steps: int) -> float:
        return (delta * (2 * math.log(steps / lengths[0]) / span - 1) if crossing else delta) + (
            lead if steps == lengths[-1] or not crossing else lead * math.log(steps / lengths[0]) / span
        )

    return _moved(table, {map_key: gap})


def null_table(table: TruthTable) -> TruthTable:
    """The A/A table: every map's mean at every length made the baseline's, each seed keeping its own deviation,
    so that any claim is false."""
    return _moved(table, {k: (lambda steps: 0.0) for k in table.flops if k != table.baseline})


def _moved(table: TruthTable, gaps: dict[str, Callable[[int], float]]) -> TruthTable:
    """Each map in `gaps` moved to the baseline's mean minus gaps[map](steps) at every length, keeping its seeds'
    deviations from its own mean."""
    losses = dict(table.losses)
    curves = dict(table.curves)
    for key, gap in gaps.items():
        for steps in table.lengths:
            base = table.seed_mean(table.baseline, steps)
            mine = table.seed_mean(key, steps)
            if base is None or mine is None:
                continue
            shift = base - gap(steps) - mine
            for (k, st, seed), value in table.losses.items():
                if k == key and st == steps and value is not None:
                    losses[(k, st, seed)] = value + shift
                    if (k, st, seed) in curves:
                        curves[(k, st, seed)] = {s: v + shift for s, v in curves[(k, st, seed)].items()}
    return dataclasses.replace(table, losses=losses, curves=curves)
