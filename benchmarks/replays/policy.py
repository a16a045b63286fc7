"""Replaying a whole policy over a truth table (benchmarks/race_replay.py, policy_speed.py): the race, or today's
one-seed rule, with every job answered from the table, scored against the table's seed means: claims, false
claims, regret of the reported best, interval coverage, compute."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ilr_search.analysis.pareto import non_dominated
from ilr_search.analysis.race_core import benjamini_hochberg
from ilr_search.analysis.racing import RaceSettings, race_state
from ilr_search.analysis.stats import decision_level, paired_comparison
from ilr_search.commands.bench.pruning import default_pruner_settings, replay_pruning
from ilr_search.config import RACE_POLICIES, RacePolicy, SearchConfig
from ilr_search.errors import UserInputError
from replays.truth import TruthTable


@dataclass
class PolicyReplay:
    """One replay of a policy over a truth table. claimed: the maps it reports as beating the baseline at the
    target; false_claims: those whose table seed mean at the target is not below the baseline's; best: the map
    it reports best, regret_sd: (its table mean loss at the target - the table's best) / the table's pooled
    seed sd there; intervals_held / intervals: its front intervals (>= 2 seeds) that hold the table's mean."""

    policy: str
    order_seed: int
    seeds: tuple[int, ...]
    compute_steps: int
    claimed: list[str]
    false_claims: list[str]
    best: str | None
    regret_sd: float | None
    intervals: int
    intervals_held: int
    verdict: str
    unanswered: list[tuple[str, int, int]]  # jobs the table could not answer (the replay stopped there)
    trained: list[tuple[str, int, int]] = field(default_factory=list)  # the race's results used, (map, steps, seed)


def _claims_and_regret(
    table: TruthTable, claimed: Sequence[str], best: str | None, target: int
) -> tuple[list[str], float | None]:
    base = table.seed_mean(table.baseline, target)
    false = [k for k in claimed if base is None or (table.seed_mean(k, target) or math.inf) >= base]
    means = [m for m in (table.seed_mean(k, target) for k in table.flops) if m is not None]
    regret = None
    sd = table.seed_sd(target)
    best_mean = table.seed_mean(best, target) if best is not None else None
    if best_mean is not None and means and math.isfinite(sd) and sd > 0:
        regret = (best_mean - min(means)) / sd
    return false, regret


# the races a replay's policy names, each for a racing policy: "race" (the adaptive race, a study's default) and
# "race-fixed"
REPLAY_RACES: dict[str, RacePolicy] = {("race" if p == "adaptive" else f"race-{p}"): p for p in RACE_POLICIES}
POLICIES = (*REPLAY_RACES, "today", "none")
FIXED_REPLAY = RaceSettings(0, 0, policy="fixed", race_contenders=6)  # the fixed race as replays measured it
# the adaptive race as a default study races it
ADAPTIVE_REPLAY = RaceSettings(
    0,
    0,
    policy="adaptive",
    race_contenders=SearchConfig().race_contenders,
    race_seeds=SearchConfig().race_seeds,
    race_screen=SearchConfig().race_screen,
    look_every=SearchConfig().look_every,
)


def race_template(policy: str = "race", **changes: Any) -> RaceSettings:
    """The race settings a replay of `policy` uses (base, target and seeds are the table's), with `changes`."""
    template = FIXED_REPLAY if REPLAY_RACES[policy] == "fixed" else ADAPTIVE_REPLAY
    return dataclasses.replace(template, **{k: v for k, v in changes.items() if v is not None})


def replay_race(
    table: TruthTable, order_seed: int, n_seeds: int | None = None, race: RaceSettings | None = None
) -> PolicyReplay:
    """Run a racing policy with every job answered from the table: base length the table's shortest, target its
    longest, the race's seeds `n_seeds` of the table's target seeds (all: None) in an order drawn from
    `order_seed` (the order decides which seed every map starts at, and which seeds come when), the other settings
    from `race` (the adaptive race of a default study where None)."""
    lengths = table.lengths
    available = list(table.seeds_at(lengths[-1]))
    random.Random(order_seed).shuffle(available)
    seeds = tuple(available[:n_seeds] if n_seeds else available)
    settings = dataclasses.replace(
        race or ADAPTIVE_REPLAY, base_steps=lengths[0], target_steps=lengths[-1], seeds=seeds, equal_compute=False
    )
    evaluations = [e for e in (table.evaluation(k, lengths[0], seeds[0]) for k in sorted(table.flops)) if e]
    unanswered: list[tuple[str, int, int]] = []
    while True:
        state = race_state(evaluations, settings, table.baseline)
        if state.done:
            break
        answers = [table.evaluation(j.map_key, j.steps, j.seed) for j in state.next_jobs]
        unanswered = [(j.map_key, j.steps, j.seed) for j, a in zip(state.next_jobs, answers, strict=True) if a is None]
        if unanswered:
            break
        evaluations += [a for a in answers if a is not None]
    target = settings.target_steps
    claimed = list(state.confirmed_better)
    at_target = [p for p in state.front if p.steps == target]
    best = state.best
    false, regret = _claims_and_regret(table, claimed, best, target)
    held = [
        p
        for p in at_target
        if len(p.seeds) >= 2
        and p.interval[0] <= math.exp(table.seed_mean(p.map_key, target) or math.nan) <= p.interval[1]
    ]
    name = next(k for k, v in REPLAY_RACES.items() if v == settings.policy)
    return PolicyReplay(
        name,
        order_seed,
        seeds,
        sum(e.steps for e in evaluations),
        claimed,
        false,
        best,
        regret,
        sum(len(p.seeds) >= 2 for p in at_target),
        len(held),
        state.verdict,
        unanswered,
        [(e.map_key, e.steps, e.seed) for e in evaluations],
    )


def replay_single_seed(table: TruthTable, order_seed: int, pruner: str) -> PolicyReplay:
    """Today's rule (pruner "pareto") or no pruning ("none"): every map once at the base length at one seed (drawn
    from `order_seed`), in a shuffled order, pruned at the rungs; the baseline at the other base seeds gives the
    noise band. It claims the recurrent maps on its front whose perplexity is below the baseline's by more than
    the band (today's front marks the rest as ties), and reports its best-perplexity map as best."""
    base = table.lengths[0]
    seeds = list(table.seeds_at(base))
    random.Random(order_seed).shuffle(seeds)
    bench = table.bench_table(base, seeds[0])
    result = replay_pruning(bench, default_pruner_settings(pruner), order_seed)
    pruned = {p.reuse_map for p in result.pruned}
    complete = [r for r in bench.rows if r.map_key not in pruned]
    band_ppls = [math.exp(v) for s in seeds for v in [table.losses.get((table.baseline, base, s))] if v is not None]
    spread = max(band_ppls) - min(band_ppls) if len(band_ppls) >= 2 else 0.0
    base_row = next((r for r in complete if r.map_key == table.baseline), None)
    front = [complete[i] for i in non_dominated([(r.val_ppl, r.flops_ratio) for r in complete])]
    claimed = sorted(
        r.map_key
        for r in front
        if base_row is not None and r.map_key != table.baseline and r.val_ppl < base_row.val_ppl - spread
    )
    best = min(complete, key=lambda r: r.val_ppl).map_key if complete else None
    target = table.lengths[-1]
    false, regret = _claims_and_regret(table, claimed, best, target)
    compute = result.steps_trained + base * (len(band_ppls) - 1)
    verdict = (
        f"{len(claimed)} recurrent map(s) beat the baseline by more than its seed spread {spread:.3f} ppl at "
        f"{base} steps, one seed"
        if claimed
        else f"no recurrent map beat the baseline at {base} steps"
    )
    return PolicyReplay(
        "today" if pruner == "pareto" else "none",
        order_seed,
        (seeds[0],),
        compute,
        claimed,
        false,
        best,
        regret,
        0,
        0,
        verdict,
        [],
    )


def table_decided_better(table: TruthTable, target: int, confidence: float) -> list[str]:
    """The maps the whole table shows better than the baseline at the target: the race's own test (paired t
    interval clear of zero, Benjamini-Hochberg over the maps) over every seed the table has."""

    def by_seed(key: str) -> dict[int, float]:
        return {s: v for (k, st, s), v in table.losses.items() if k == key and st == target and v is not None}

    keys = sorted(k for k in table.flops if k != table.baseline)
    tests = [paired_comparison(by_seed(k), by_seed(table.baseline), confidence) for k in keys]
    adjusted = benjamini_hochberg([t.p_value for t in tests])
    return [k for k, t, p in zip(keys, tests, adjusted, strict=True) if t.n >= 2 and p < decision_level(confidence)]


@dataclass(frozen=True)
class PolicyReplays:
    """A policy replayed over a truth table in `orders` orders, beside what the whole table shows (the maps whose
    seed mean beats the baseline's at the target, and those its own test decides better), with the goals' figures
    over the replays: compute, claims and false claims, regret in seed sd, coverage of the front's intervals; and
    every replay. to_json is what the scripts write."""

    table: str
    policy: str
    orders: int
    base_steps: int
    target_steps: int
    table_seeds: list[int]
    maps: int
    baseline: str
    confidence: float
    seed_sd_at_target: float
    table_better_than_baseline: list[str]
    table_decided_better: list[str]
    decided_claimed_share: float | None  # None: the table decides no map better
    exhaustive_steps: int
    mean_compute_steps: float
    maps_claimed: int
    false_claims: int
    false_claim_share: float
    mean_regret_sd: float | None
    max_regret_sd: float | None
    regret_within_1sd_share: float | None
    intervals: int
    interval_coverage: float | None
    replays: tuple[PolicyReplay, ...]

    def to_json(self) -> dict[str, Any]:
        report = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "replays"}
        return report | {"replays": [dataclasses.asdict(r) for r in self.replays]}


def replay_policy(
    path: str | Path,
    policy: str,
    orders: int = 10,
    first_order: int = 0,
    n_seeds: int | None = None,
    confidence: float = 0.9,
    max_contenders: int | None = None,
    table: TruthTable | None = None,
    **race_changes: Any,
) -> PolicyReplays:
    """A policy replayed over a truth table in `orders` orders, with the goals' figures: false confirmations (share
    of claimed maps that do not beat the baseline in the table's seed mean at the target), regret of the reported
    best in seed sd, and the coverage of the front's intervals."""
    if policy not in POLICIES:
        raise UserInputError(f"unknown --policy {policy!r}; use {', '.join(POLICIES)}")
    if orders < 1:
        raise UserInputError(f"--orders must be at least 1, got {orders}")
    if not 0 < confidence < 1:
        raise UserInputError(f"--confidence must be between 0 and 1, got {confidence}")
    if max_contenders is not None and max_contenders < 1:
        raise UserInputError(f"--max-contenders must be at least 1, got {max_contenders}")
    table = table or TruthTable.read(path)
    if n_seeds is not None and not 1 <= n_seeds <= len(table.seeds_at(table.lengths[-1])):
        raise UserInputError(
            f"--race-seeds must be between 1 and the table's {len(table.seeds_at(table.lengths[-1]))} "
            f"seeds at its longest length, got {n_seeds}"
        )
    if len(table.lengths) < 2:
        raise UserInputError(f"truth table {str(path)!r} has one length ({table.lengths[0]} steps); a race needs two")
    race = (
        race_template(policy, confidence=confidence, race_contenders=max_contenders, **race_changes)
        if policy in REPLAY_RACES
        else None
    )
    runs = [
        replay_race(table, o, n_seeds, race)
        if race is not None
        else replay_single_seed(table, o, "pareto" if policy == "today" else "none")
        for o in range(first_order, first_order + orders)
    ]
    target = table.lengths[-1]
    base_mean = table.seed_mean(table.baseline, target)
    truly_better = sorted(
        k
        for k in table.flops
        if k != table.baseline and base_mean is not None and (table.seed_mean(k, target) or math.inf) < base_mean
    )
    decided = table_decided_better(table, target, confidence)
    claimed = sum(len(r.claimed) for r in runs)
    false = sum(len(r.false_claims) for r in runs)
    regrets = [r.regret_sd for r in runs if r.regret_sd is not None]
    intervals = sum(r.intervals for r in runs)

    return PolicyReplays(
        table=str(path),
        policy=policy,
        orders=orders,
        base_steps=table.lengths[0],
        target_steps=target,
        table_seeds=list(table.seeds_at(target)),
        maps=len(table.flops),
        baseline=table.baseline,
        confidence=confidence,
        seed_sd_at_target=table.seed_sd(target),
        table_better_than_baseline=truly_better,
        table_decided_better=decided,
        decided_claimed_share=(
            sum(len(set(r.claimed) & set(decided)) for r in runs) / (len(decided) * orders) if decided else None
        ),
        exhaustive_steps=sum(steps for (_, steps, _) in table.losses),
        mean_compute_steps=statistics.fmean(r.compute_steps for r in runs),
        maps_claimed=claimed,
        false_claims=false,
        false_claim_share=false / claimed if claimed else 0.0,
        mean_regret_sd=statistics.fmean(regrets) if regrets else None,
        max_regret_sd=max(regrets) if regrets else None,
        regret_within_1sd_share=sum(r <= 1 for r in regrets) / len(regrets) if regrets else None,
        intervals=intervals,
        interval_coverage=sum(r.intervals_held for r in runs) / intervals if intervals else None,
        replays=tuple(runs),
    )
