"""The race's power, measured on itself (benchmarks/power.py runs it): a truth table with a planted gap, the race
replayed over it in many orders, and how often it claims the planted map.

For each gap Δ (in the table's pooled seed sd at the target, so that tables of different noise compare), each
planted map (every recurrent map of the table, or those asked for) and each order of the seeds:
- the map is made truly better than the baseline by Δ (truth.planted: constant across lengths, or crossing:
  worse by Δ at the base length, better by Δ at the target), each seed keeping its own noise; where recurrent
  maps already beat the baseline (a real win), a map 1 sd better than the baseline is no better than they are,
  so the gap can be planted against the table's best map instead (`against="best"`);
- the race is replayed over the planted table (policy.replay_race);
- power: the share of replays that claim the planted map; false claims: the share that claim a map the planted
  table does not show better than the baseline (its seed mean at the target is not below the baseline's).
At Δ = 0 the table is the A/A table (truth.null_table: every map at the baseline's mean): any claim is false.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ilr_search.analysis.racing import RaceSettings
from ilr_search.errors import UserInputError
from ilr_search.records import record_json
from replays.policy import REPLAY_RACES, race_template, replay_race
from replays.truth import TruthTable, null_table, planted

DEFAULT_DELTAS = (0.0, 0.5, 1.0, 2.0, 3.0, 4.0)


@dataclass(frozen=True)
class PowerRow:
    """One gap of one race setting, over every planted map and order."""

    setting: str
    delta_sd: float
    delta_nats: float
    crossing: bool
    replays: int
    power: float | None  # share of replays claiming the planted map (None at Δ = 0)
    any_claim: float  # share of replays claiming anything
    false_claims: float  # share of replays claiming a map not truly better
    mean_compute_steps: float
    regret_within_1sd: float | None
    by_map: dict[str, float]  # planted map -> its power
    # share of replays whose planted map was raced on test seeds (a contender past the screen; None at Δ = 0): a
    # replay that misses the planted map misses it at the screen where this is below the power's complement
    raced: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class PowerSetting:
    """A race setting the power is measured for, and the seeds a fixed race takes (None: the race's own)."""

    race: RaceSettings
    seeds: int | None

    def to_dict(self) -> dict[str, Any]:
        race = self.race
        return {
            "policy": race.policy,
            "seeds": self.seeds,
            "max_contenders": race.race_contenders,
            "min_seeds": race.race_seeds,
            "screen": race.race_screen,
            "max_steps": race.max_steps,
            "futility": race.futility,
            "test": race.test,
            "look_every": race.look_every,
            "confidence": race.confidence,
        }


@dataclass(frozen=True)
class PowerReport:
    """The race's power over a truth table: the truth table (its maps, baseline, lengths, seeds at the target and their
    pooled sd), the maps planted, the orders, what the gap is to, the race settings by name, the policies a
    replay takes, and one row per setting and gap. to_json is what benchmarks/power.py writes."""

    table: str
    maps: int
    planted_maps: list[str]
    baseline: str
    base_steps: int
    target_steps: int
    table_seeds: list[int]
    seed_sd_at_target: float
    orders: int
    against: str
    settings: dict[str, PowerSetting]
    policies: list[str]
    rows: tuple[PowerRow, ...]

    def to_json(self) -> dict[str, Any]:
        return record_json(self)


def _truly_better(table: TruthTable) -> set[str]:
    target = table.lengths[-1]
    base = table.seed_mean(table.baseline, target)
    return {
        k
        for k in table.flops
        if k != table.baseline and base is not None and (table.seed_mean(k, target) or math.inf) < base
    }


def power_row(
    table: TruthTable,
    setting: str,
    race: RaceSettings,
    delta_sd: float,
    crossing: bool,
    maps: Sequence[str],
    orders: int,
    n_seeds: int | None = None,
    against: str = "baseline",
) -> PowerRow:
    """Replay `race` over the table planted at Δ = delta_sd (in seed sd at the target) in each of `maps`, `orders`
    orders each (the A/A table once per order at Δ = 0); `against`: the gap is to the baseline, or to the table's
    best map at the target (truth.planted)."""
    sd = table.seed_sd(table.lengths[-1])
    delta = delta_sd * sd
    replays, hits, any_claims, false, raced, regrets = 0, 0, 0, 0, 0, []
    compute: list[int] = []
    by_map: dict[str, float] = {}
    plants = [None] if delta_sd == 0 else list(maps)
    for key in plants:
        variant = null_table(table) if key is None else planted(table, key, delta, crossing, against)
        true = _truly_better(variant)
        mine = 0
        for order in range(orders):
            r = replay_race(variant, order, n_seeds, race)
            replays += 1
            compute.append(r.compute_steps)
            claimed = set(r.claimed)
            any_claims += bool(claimed)
            false += bool(claimed - true)
            if key is not None and key in claimed:
                hits += 1
                mine += 1
            if key is not None and any(
                k == key and steps == variant.lengths[-1] and seed != r.seeds[0] for k, steps, seed in r.trained
            ):
                raced += 1
            if r.regret_sd is not None:
                regrets.append(r.regret_sd)
        if key is not None:
            by_map[key] = mine / orders
    return PowerRow(
        setting,
        delta_sd,
        delta,
        crossing,
        replays,
        hits / replays if delta_sd else None,
        any_claims / replays,
        false / replays,
        statistics.fmean(compute),
        sum(r <= 1 for r in regrets) / len(regrets) if regrets else None,
        by_map,
        raced / replays if delta_sd else None,
    )


def parse_deltas(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or any(not math.isfinite(v) or v < 0 for v in values):
        raise UserInputError(
            f"--deltas takes gaps in seed sd, comma-separated, each 0 or more (e.g. 0,1,2), got {text!r}"
        )
    return values


def power_report(
    path: str | Path,
    settings: dict[str, RaceSettings] | None = None,
    deltas: Sequence[float] = DEFAULT_DELTAS,
    crossing: Sequence[float] = (2.0,),
    orders: int = 10,
    maps: Sequence[str] | None = None,
    n_seeds: dict[str, int | None] | None = None,
    table: TruthTable | None = None,
    against: str = "baseline",
) -> PowerReport:
    """Power, false claims, the A/A rate and compute per gap for each race setting (by
    name; default: the adaptive race of a default study and the fixed 3-seed race), constant gaps `deltas` and
    crossing gaps `crossing`, in seed sd, planted against the baseline or the table's best map (`against`)."""
    if against not in ("baseline", "best"):
        raise UserInputError(f"unknown --against {against!r}; use baseline or best")
    if orders < 1:
        raise UserInputError(f"--orders must be at least 1, got {orders}")
    table = table or TruthTable.read(path)
    if len(table.lengths) < 2:
        raise UserInputError(f"truth table {str(path)!r} has one length ({table.lengths[0]} steps); a race needs two")
    recurrent = sorted(k for k in table.flops if k != table.baseline)
    chosen = list(maps) if maps else recurrent
    unknown = [k for k in chosen if k not in recurrent]
    if unknown:
        raise UserInputError(f"--maps: {', '.join(unknown)} not a recurrent map of the table ({', '.join(recurrent)})")
    settings = settings or {"adaptive": race_template("race"), "fixed-3-seeds": race_template("race-fixed")}
    n_seeds = n_seeds if n_seeds is not None else {"fixed-3-seeds": 3}
    target = table.lengths[-1]
    rows = []
    for name, race in settings.items():
        for d in deltas:
            rows.append(power_row(table, name, race, d, False, chosen, orders, n_seeds.get(name), against))
        for d in crossing:
            rows.append(power_row(table, name, race, d, True, chosen, orders, n_seeds.get(name), against))
    return PowerReport(
        str(path),
        len(table.flops),
        chosen,
        table.baseline,
        table.lengths[0],
        target,
        list(table.seeds_at(target)),
        table.seed_sd(target),
        orders,
        against,
        {name: PowerSetting(race, n_seeds.get(name)) for name, race in settings.items()},
        sorted(REPLAY_RACES),
        tuple(rows),
    )
