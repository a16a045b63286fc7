"""The adaptive race: judged at the target length, with seeds bought until each comparison is decided.

A pure policy over the study's evaluations (race_core.py has the types; racing.race_state picks it for the
"adaptive" policy). Its stages:

1. Base results. Every known map's result at the base length and seeds[0] (the trials').
2. The screen at the target. The `screen` maps nearest the base front (the baseline first) are trained at the
   target at seeds[0], best base result first, in waves of `calibration` maps. Base results only order this
   promotion: learning curves of reuse maps cross (fast starters finish slow), so a base result eliminates a map
   before the target only where the screen itself shows that the two lengths rank alike. Once `calibration`
   maps are screened and the Spearman between their base and target results is at least `min_agreement`, a
   waiting map is eliminated when a screened map of no more FLOPs leads it at the base length by more than the
   largest base lead that the target overturned among the screened maps (the margin of the calibrated pruner,
   pruners.py, applied to lengths).
3. Contenders. The race_contenders screened maps nearest the target's front (the baseline among them).
4. Seeds at the target. Seed seeds[0] chose the contenders, so their comparisons with the baseline are tested on
   seeds[1:] only: the choice cannot bias the test. Each contender gets race_seeds - 1 of them, then `look_every`
   more a wave (up to the pool's last; 0: two where the pool has at most 4 test seeds, else one: looks_apart) while
   its comparison is open. After every wave each comparison is tested by a
   sequential paired t test (sequential.py) that keeps its level at its looks (the first, every look_every seeds
   after it, the pool's last), with the family's level split over the
   contenders by a weighted Holm step-down (valid for group-sequential tests too: Maurer and Bretz 2013): the
   screen's best gets the share `lead_share`, the rest split what is left, and a claim passes its share on. The
   weights come from seeds[0], which the tests never see. A
   comparison is decided when the test claims the contender better, or when it trails the baseline so far that it
   cannot win (its paired t test at the one-sided level `futility`; stopping without a claim only makes the test
   more conservative), or when a contender of no more FLOPs beats it by a paired test; it stays open until the pool's
   seeds are spent or the compute cap `max_steps` is reached.
5. The equal-compute model (equal_compute). A plain model with as many layers as the best recurrent
   contender runs (deepR: R layers, all run once) is trained at the target at that contender's seeds, once the
   contenders are decided: is recurrence better than a deeper model of the same compute? Its cost is kept
   within the cap from the start.

The verdict says what the race found at the target, with the smallest gap it would have found at 80% power from
its own seeds and paired sd (sequential.detectable_gap), and the compute it spent.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeGuard

from ilr_search.analysis.answer import interval_words, ppl_gain, side
from ilr_search.analysis.race_core import (
    CANNOT_WIN,
    DECIDED_AGAINST,
    Comparison,
    DeepDiff,
    DetectableGap,
    EqualCompute,
    Evaluation,
    FrontPoint,
    RaceJob,
    RaceSettings,
    RaceState,
    Results,
    Screen,
    ScreenAgreement,
    base_results,
    by_seed,
    choose_contenders,
    collect,
    loss_front,
    race_compute,
)
from ilr_search.analysis.replicates import Replicates
from ilr_search.analysis.sequential import (
    SequentialTest,
    detectable_gap,
    look_schedule,
    looks_apart,
    next_look,
    t_statistic,
)
from ilr_search.analysis.stats import decision_level, paired_comparison, rank_agreement, seed_interval
from ilr_search.analysis.unit_pairs import UnitPairs, UnitTest, unit_detectable_gap, unit_pairs
from ilr_search.training.schedule import Map

DETECTION_POWER = 0.8


def layer_runs(map_key: str, n_layers: int | None = None) -> int:
    """The layers a map's schedule runs (a reuse map's counts' sum); a key's knob part (after '|') is ignored. A
    block map's key needs the model's `n_layers`."""
    return Map.parse(map_key, n_layers).layer_runs


def _finite(value: float | None) -> TypeGuard[float]:
    return value is not None and math.isfinite(value)


def _diffs(
    results: Results, key: str, baseline_key: str, steps: int, pool: Sequence[int]
) -> tuple[list[int], list[float]]:
    mine, base = results.at(key, steps), results.at(baseline_key, steps)
    seeds = [s for s in pool if s in mine and s in base]
    return seeds, [mine[s] - base[s] for s in seeds]


def by_unit(
    results: Results, key: str, baseline_key: str, steps: int, seeds: Sequence[int], settings: RaceSettings
) -> UnitPairs | None:
    """A frozen comparison's unit pairs (unit_pairs.py) over its common seeds (chunks), where every one of them kept
    both maps' per-unit scores; None otherwise (a trained race, or runs stored without their scores: paired by
    seed)."""
    if not settings.frozen or not seeds:
        return None
    mine = {s: results.units(key, steps, s) for s in seeds}
    base = {s: results.units(baseline_key, steps, s) for s in seeds}
    pairs = unit_pairs(mine, base, seeds, settings.binary)
    return pairs if pairs.chunks == tuple(seeds) else None


def holm_claims(
    keys: Sequence[str], weights: Mapping[str, float], alpha: float, crossed: Callable[[str, float], int | None]
) -> tuple[dict[str, tuple[float, int]], dict[str, float]]:
    """The weighted Holm step-down over sequential tests: each comparison not yet claimed is tested at its share of
    the family level, alpha * weight / (the weights still unclaimed); a claim passes its share on to the rest.
    `crossed(key, level)`: the look at which key's test at `level` claims (None: it does not). Returns the claims
    {key: (level, look at the claim)} and the levels the rest are held to."""
    remaining = sorted(keys)
    claimed: dict[str, tuple[float, int]] = {}
    levels: dict[str, float] = {}
    while remaining:
        total = math.fsum(weights[k] for k in remaining)
        levels = {k: alpha * weights[k] / total for k in remaining}
        found = {k: crossed(k, levels[k]) for k in remaining}
        new = {k: n for k, n in found.items() if n is not None}
        if not new:
            return claimed, levels
        claimed |= {k: (levels[k], n) for k, n in new.items()}
        remaining = [k for k in remaining if k not in new]
    return claimed, {}


def holm_weights(ranked: Sequence[str], lead: float) -> dict[str, float]:
    """The first of `ranked` (the screen's best) gets the share `lead` of the family's level, the rest split the
    remainder equally (lead 1: a fixed sequence, the rest tested only once the first is claimed)."""
    if len(ranked) <= 1:
        return {k: 1.0 for k in ranked}
    rest = (1 - lead) / (len(ranked) - 1)
    return {k: (lead if i == 0 else max(rest, 1e-12)) for i, k in enumerate(ranked)}


def screen_agreement(
    screened: Sequence[str], base_losses: Mapping[str, float], target_losses: Mapping[str, float]
) -> ScreenAgreement:
    """How the base length ranks the screened maps against the target: Spearman over them, and the margin, the
    largest base lead the target overturned (b led a at the base, a finished ahead at the target)."""
    keys = [k for k in screened if k in base_losses and k in target_losses]
    rho, _ = rank_agreement([base_losses[k] for k in keys], [target_losses[k] for k in keys])
    margin = 0.0
    for a in keys:
        for b in keys:
            if base_losses[b] < base_losses[a] and target_losses[a] < target_losses[b]:
                margin = max(margin, base_losses[a] - base_losses[b])
    return ScreenAgreement(len(keys), rho, margin)


def adaptive_race_state(evaluations: Sequence[Evaluation], settings: RaceSettings, baseline_key: str) -> RaceState:
    """The adaptive race's decision from every evaluation (see the module docstring)."""
    maps = [e for e in evaluations if Map.form_of(e.map_key) != "deeper"]  # the equal-compute models are no contenders
    _, early, base_losses, eliminated = base_results(maps, settings, baseline_key)
    if early is not None:
        return early
    results = collect(evaluations)
    target, first, words = settings.target_steps, settings.seeds[0], settings.words
    compute = race_compute(evaluations, settings)
    cap = settings.max_steps

    def fits(jobs: Sequence[RaceJob], reserve: int = 0) -> bool:
        return cap is None or compute + sum(j.steps for j in jobs) + reserve <= cap

    # 2. the screen at the target, at seeds[0]
    candidates = choose_contenders(base_losses, results.flops, baseline_key, settings.race_screen)
    not_raced = tuple(k for k in sorted(base_losses) if k not in candidates)
    screened = [k for k in candidates if first in results.losses.get(k, {}).get(target, {})]
    screen_losses: dict[str, float] = {}
    for k in screened:
        loss = results.losses[k][target][first]
        if _finite(loss):
            screen_losses[k] = float(loss)
        else:
            eliminated[k] = f"diverged {words.at(target)}, {words.one(first)}"
    if baseline_key in screened and baseline_key not in screen_losses:
        return _ended(
            f"the baseline {baseline_key} diverged {words.at(target)}: nothing to race against",
            eliminated,
            not_raced,
            compute,
            target,
        )
    agreement = screen_agreement(list(screen_losses), base_losses, screen_losses)
    agree = (
        agreement.maps >= settings.calibration
        and agreement.spearman is not None
        and agreement.spearman >= settings.min_agreement
    )
    waiting = []
    for k in candidates:
        if k in screened:
            continue
        lead = [
            o
            for o in screen_losses
            if results.flops[o] <= results.flops[k] and base_losses[k] - base_losses[o] > agreement.margin
        ]
        if agree and lead and k != baseline_key:
            o = min(lead, key=lambda x: (base_losses[x], x))
            eliminated[k] = (
                f"eliminated at {settings.base_steps} steps: the screen's lengths rank alike (Spearman "
                f"{agreement.spearman:.2f} over {agreement.maps} maps) and {o} leads it by "
                f"{base_losses[k] - base_losses[o]:.4f}, more than the largest lead the target "
                f"overturned ({agreement.margin:.4f})"
            )
        else:
            waiting.append(k)
    screen = Screen(
        tuple(candidates),
        tuple(sorted(screen_losses)),
        agreement,
        {k: base_losses[k] for k in candidates},
        dict(screen_losses),
    )
    if waiting:
        wave = [RaceJob(k, target, first) for k in waiting[: max(1, settings.calibration)]]
        if fits(wave):
            return RaceState(
                alive=tuple(waiting),
                eliminated=eliminated,
                next_jobs=tuple(wave),
                not_raced=not_raced,
                level_steps=target,
                compute_steps=compute,
                screen=screen,
                verdict=f"(race open {words.at(target)}) screening {len(waiting)} map(s) at {words.one(first)}",
            )
        screen = dataclasses.replace(screen, capped=tuple(waiting))
        for k in waiting:
            eliminated[k] = f"not screened: the compute cap ({cap} steps) was reached"

    # 3. contenders, from the screen
    contenders = choose_contenders(screen_losses, results.flops, baseline_key, settings.race_contenders)
    for k in screen_losses:
        if k not in contenders:
            nearest = "the front on it" if settings.frozen else "the target's front"
            eliminated[k] = (
                f"screened {words.at(target)} ({words.one(first)}, loss {screen_losses[k]:.4f}): not among the "
                f"{settings.race_contenders} maps nearest {nearest}"
            )
    # 4. seeds at the target, tested on seeds[1:]
    pool = settings.seeds[1:]
    first_look = max(2, settings.race_seeds - 1)
    family = [k for k in contenders if k != baseline_key]
    alpha = decision_level(settings.confidence)
    every = looks_apart(settings.look_every, len(pool))
    testable = len(pool) >= first_look
    paths = {k: _diffs(results, k, baseline_key, target, pool) for k in family}
    units = {k: by_unit(results, k, baseline_key, target, paths[k][0], settings) for k in family}
    ranked = sorted(family, key=lambda k: (screen_losses[k], k))
    weights = holm_weights(ranked, settings.lead_share)

    def crossed(key: str, level: float) -> int | None:
        pairs = units[key]
        if pairs is not None:
            return UnitTest(level, first_look, len(pool), every).crossed_at(pairs.shifted(settings.margin))
        return SequentialTest(level, first_look, len(pool), settings.test, every=every).crossed_at(paths[key][1])

    claims, open_levels = holm_claims(family, weights, alpha, crossed) if testable and family else ({}, {})
    comparisons: dict[str, Comparison] = {}
    for k in family:
        seeds, diffs = paths[k]
        comparisons[k] = _compare(
            k,
            results,
            baseline_key,
            target,
            seeds,
            diffs,
            settings,
            claims,
            open_levels.get(k, alpha * weights[k]),
            first_look,
            len(pool),
            units[k],
        )
    if not settings.two_sided:  # a judge judges each candidate against the baseline alone
        _stop_dominated(comparisons, results, target, settings, first_look)
    for k, c in comparisons.items():
        diverged = [s for s in results.diverged_at(k, target) if s in pool]
        if diverged:
            comparisons[k] = _with(c, "diverged", f"diverged {words.at(target)}, {words.one(diverged[0])}")
        if comparisons[k].status in DECIDED_AGAINST:
            eliminated[k] = comparisons[k].why
    best = _best_recurrent(comparisons, results, target)
    deep = (
        Map.of_deeper(layer_runs(best, Map.parse(baseline_key).n_layers)).key
        if settings.equal_compute and best is not None
        else None
    )
    jobs = _seed_wave(comparisons, results, baseline_key, target, pool, first_look, every) if testable else []
    stopped = ""
    reserve = _deep_jobs(deep, best, results, target, jobs)
    if jobs and not fits(jobs, sum(j.steps for j in reserve)):
        stopped = f"the compute cap ({cap} steps) was reached"
        for k, c in comparisons.items():
            if c.status == "open":
                comparisons[k] = _with(c, "capped", stopped)
        jobs = []
    if not jobs:
        deep_jobs = _deep_jobs(deep, best, results, target, [])
        if deep_jobs and fits(deep_jobs):
            jobs = deep_jobs
        elif deep_jobs:
            stopped = stopped or f"the compute cap ({cap} steps) was reached"
    done = not jobs
    if done and not stopped:
        stopped = _why_done(list(comparisons.values()), testable, first_look, len(pool), words)
    alive = sorted((k for k in contenders if k not in eliminated), key=lambda k: (_mean(results, k, target), k))
    front = _front(alive, results, target, settings.confidence, tuple(claims))
    better = tuple(sorted(claims, key=lambda k: (comparisons[k].mean_diff or 0.0, k)))
    gap = _detectable(list(comparisons.values()), results, baseline_key, target, settings, first_look, len(pool), units)
    equal = _equal_compute(deep, best, results, target, settings, baseline_key)
    verdict = _verdict(
        comparisons, better, results, baseline_key, target, settings, done, gap, equal, compute, stopped, contenders
    )
    return RaceState(
        alive=tuple(alive),
        eliminated=eliminated,
        next_jobs=tuple(jobs),
        front=front,
        verdict=verdict,
        done=done,
        not_raced=not_raced,
        level_steps=target,
        confirmed_better=better,
        best=min(better, key=lambda k: (_mean(results, k, target), k)) if better else baseline_key,
        compute_steps=compute,
        comparisons=tuple(comparisons.values()),
        screen=screen,
        equal_compute=equal,
        detectable_gap=gap,
        stopped=stopped,
    )


def _ended(
    verdict: str, eliminated: dict[str, str], not_raced: tuple[str, ...], compute: int, target: int
) -> RaceState:
    return RaceState(
        alive=(),
        eliminated=eliminated,
        not_raced=not_raced,
        level_steps=target,
        done=True,
        verdict=verdict,
        compute_steps=compute,
        stopped=verdict,
    )


def _mean(results: Results, key: str, steps: int) -> float:
    losses = results.at(key, steps)
    return math.fsum(losses.values()) / len(losses) if losses else math.inf


def _sequential(settings: RaceSettings, level: float, first_look: int, max_n: int) -> SequentialTest:
    """The race's sequential test of one comparison held to `level`, over a pool of max_n test seeds."""
    return SequentialTest(level, first_look, max_n, settings.test, every=looks_apart(settings.look_every, max_n))


def _compare(
    key: str,
    results: Results,
    baseline_key: str,
    target: int,
    seeds: list[int],
    diffs: list[float],
    settings: RaceSettings,
    claims: Mapping[str, tuple[float, int]],
    open_level: float,
    first_look: int,
    max_n: int,
    pairs: UnitPairs | None = None,
) -> Comparison:
    mine, base = results.at(key, target), results.at(baseline_key, target)
    words = settings.words
    level, decided_at = claims.get(key, (open_level, None))
    flops = results.flops[key]
    common: dict[str, Any]
    if pairs is not None:  # frozen, paired by unit over the chunks
        t = pairs.statistic()
        test = UnitTest(level, first_look, max_n, looks_apart(settings.look_every, max_n))
        boundary = test.boundary(pairs)
        common = dict(
            map_key=key,
            flops_ratio=flops,
            seeds=tuple(seeds),
            mean_diff=pairs.mean(),
            sd_diff=pairs.sd(),
            interval=test.interval(pairs),  # the sequential test's own: it cannot contradict its decision
            p_value=pairs.p_value(),
            t=t,
            level=level,
            boundary=boundary if len(seeds) >= first_look else None,
            units=pairs.n,
            detectable=_plus(unit_detectable_gap(pairs, test, DETECTION_POWER), settings.margin),
        )
        dof = max(1, pairs.n - 1)
        if settings.two_sided and decided_at is None:
            worse_at = test.crossed_at(pairs.reversed().shifted(settings.margin))
            if worse_at is not None:
                return Comparison(
                    **common,
                    status="worse",
                    decided_at=worse_at,
                    why=f"worse than the baseline {words.at(target)}: the sequential test paired by {words.paired} "
                    f"at level {level:.3g}, run the other way, claimed the baseline better after "
                    f"{words.count(worse_at)} ({pairs.n} {words.paired}s paired)",
                )
    else:
        c = paired_comparison({s: mine[s] for s in seeds}, {s: base[s] for s in seeds}, settings.confidence)
        t = t_statistic(diffs)
        seed_test = _sequential(settings, level, first_look, max_n)
        boundary = seed_test.boundary(len(seeds)) if settings.test == "spending" and len(seeds) >= first_look else None
        common = dict(
            map_key=key,
            flops_ratio=flops,
            seeds=tuple(seeds),
            mean_diff=c.mean_diff if seeds else None,
            sd_diff=c.sd_diff,
            interval=c.interval,
            p_value=c.p_value,
            t=t,
            level=level,
            boundary=boundary,
        )
        dof = len(seeds) - 1
    mean_diff = common["mean_diff"]
    unit_words = f" ({pairs.n} {words.paired}s paired)" if pairs is not None else ""
    if decided_at is not None:
        test_name = (
            "a sequential paired t test"
            if pairs is None
            else "an exact sequential sign test paired by item"
            if pairs.binary
            else f"a sequential t test paired by {words.paired}"
        )
        return Comparison(
            **common,
            status="better",
            decided_at=decided_at,
            why=f"better than the baseline {words.at(target)}: {test_name} at level "
            f"{level:.3g} claimed it after {words.count(decided_at)}",
        )
    if settings.two_sided and pairs is None and len(seeds) >= first_look:
        worse_at = _sequential(settings, level, first_look, max_n).crossed_at([-d for d in diffs])
        if worse_at is not None:
            return Comparison(
                **common,
                status="worse",
                decided_at=worse_at,
                why=f"worse than the baseline {words.at(target)}: the sequential paired t test at level {level:.3g}, "
                f"run the other way, claimed the baseline better after {words.count(worse_at)}",
            )
    if t is not None and len(seeds) >= first_look and not settings.two_sided:
        from scipy.stats import t as student

        bound = float(student.ppf(1 - settings.futility, dof))
        if t < -bound:
            return Comparison(
                **common,
                status=CANNOT_WIN,
                why=f"stopped: cannot win against the baseline {words.at(target)}: its loss is "
                f"{mean_diff:.4f} above the baseline's on average over {words.count(len(seeds))}{unit_words}, "
                f"{-t:.2f} standard errors past even, more than the {bound:.2f} at which a "
                f"later claim becomes unlikely (futility level {settings.futility:g})",
            )
    if len(seeds) >= max_n:
        return Comparison(
            **common, status="undecided", why=f"undecided after the pool's {words.count(max_n, test=True)}"
        )
    return Comparison(**common, status="open")


def _with(c: Comparison, status: str, why: str) -> Comparison:
    return dataclasses.replace(c, status=status, why=why)


def _stop_dominated(
    comparisons: dict[str, Comparison], results: Results, target: int, settings: RaceSettings, first_look: int
) -> None:
    """An open contender that a contender of no more FLOPs beats by a paired test over their common test seeds
    gets no more seeds (it cannot be on the front)."""
    alpha = decision_level(settings.confidence)
    for k, c in list(comparisons.items()):
        if c.status != "open":
            continue
        mine = {s: v for s, v in results.at(k, target).items() if s in settings.seeds[1:]}
        for o in sorted(comparisons, key=lambda x: (results.flops[x], x)):
            if o == k or results.flops[o] > results.flops[k] or comparisons[o].status in ("diverged",):
                continue
            theirs = {s: v for s, v in results.at(o, target).items() if s in settings.seeds[1:]}
            common = sorted(set(mine) & set(theirs), key=settings.seeds.index)
            pairs = by_unit(results, o, k, target, common, settings) if c.units else None
            if pairs is not None:
                n, mean_diff, p = len(pairs.chunks), pairs.mean(), pairs.p_value()
            else:
                test = paired_comparison(theirs, mine, settings.confidence)
                n, mean_diff, p = test.n, test.mean_diff, test.p_value
            if n >= first_look and p < alpha and mean_diff is not None:
                comparisons[k] = _with(
                    c,
                    "dominated",
                    f"{o} better than {k} {settings.words.at(target)}: loss difference "
                    f"{mean_diff:+.4f} over {settings.words.count(n)}, one-sided paired "
                    f"{'test' if pairs is not None else 't'} p={p:.3g} < {alpha:.3g}",
                )
                break


def _seed_wave(
    comparisons: Mapping[str, Comparison],
    results: Results,
    baseline_key: str,
    target: int,
    pool: Sequence[int],
    first_look: int,
    every: int = 1,
) -> list[RaceJob]:
    """The next wave: every open contender's first first_look test seeds at once, then the seeds up to its test's
    next look (`every` more); the baseline gets every seed of the wave it lacks. Jobs best mean first, the baseline
    first of all."""
    open_keys = sorted(
        (k for k, c in comparisons.items() if c.status == "open"), key=lambda k: (_mean(results, k, target), k)
    )
    looks = look_schedule(first_look, len(pool), every)
    wanted: dict[str, list[int]] = {}
    for k in open_keys:
        have = results.losses.get(k, {}).get(target, {})
        missing = [s for s in pool if s not in have]
        trained = len(pool) - len(missing)
        step = (next_look(looks, trained) or len(pool)) - trained
        wanted[k] = (
            [s for s in missing if pool.index(s) < first_look] if trained < first_look else missing[: max(1, step)]
        )
    seeds = sorted({s for v in wanted.values() for s in v}, key=pool.index)
    have_base = results.losses.get(baseline_key, {}).get(target, {})
    jobs = [RaceJob(baseline_key, target, s) for s in seeds if s not in have_base]
    return jobs + [RaceJob(k, target, s) for k in open_keys for s in wanted[k]]


def _best_recurrent(comparisons: Mapping[str, Comparison], results: Results, target: int) -> str | None:
    """The recurrent contender with the lowest mean loss at the target (claims first)."""
    keys = [k for k, c in comparisons.items() if c.status not in ("diverged",)]
    if not keys:
        return None
    return min(keys, key=lambda k: (comparisons[k].status != "better", _mean(results, k, target), k))


def _deep_jobs(
    deep: str | None, best: str | None, results: Results, target: int, wave: Sequence[RaceJob]
) -> list[RaceJob]:
    """The equal-compute model's jobs: the best contender's target seeds (after `wave`) it lacks."""
    if deep is None or best is None:
        return []
    seeds = set(results.losses.get(best, {}).get(target, {})) | {j.seed for j in wave if j.map_key == best}
    have = results.losses.get(deep, {}).get(target, {})
    return [RaceJob(deep, target, s) for s in sorted(seeds) if s not in have]


def _front(
    alive: Sequence[str], results: Results, steps: int, confidence: float, claimed: Sequence[str]
) -> tuple[FrontPoint, ...]:
    """The non-dominated contenders at the target by (mean loss, FLOPs), cheapest first; confirmed: claimed better
    than the baseline by the sequential test (the baseline is the reference, never confirmed)."""
    front = loss_front(alive, results, steps, confidence)
    return tuple(dataclasses.replace(p, confirmed=p.map_key in claimed) for p in front)


def _plus(gap: float | None, margin: float) -> float | None:
    """A detectable gap where claims need the difference beyond `margin` (RaceSettings.margin)."""
    return None if gap is None else gap + margin


def _detectable(
    comparisons: Sequence[Comparison],
    results: Results,
    baseline_key: str,
    target: int,
    settings: RaceSettings,
    first_look: int,
    max_n: int,
    units: Mapping[str, UnitPairs | None] | None = None,
) -> DetectableGap | None:
    """The smallest gap the race would have found with 80% power, at the level of the screen's best (the largest
    share of the family's). Paired by seed: at the most test seeds any comparison reached, with the race's paired sd
    (pooled over its comparisons), against the sequential boundary there. Paired by unit (a frozen race): from the
    unit differences of the comparison nearest the baseline (the smallest mean difference), whose spread is the
    one a map that could win would have, at the chunks it reached (a map far behind has a spread of its own)."""
    level = max((c.level for c in comparisons), default=0.0)
    base = _mean(results, baseline_key, target)
    paired = [(c, pairs) for c in comparisons if (pairs := (units or {}).get(c.map_key)) is not None and c.n >= 1]
    if paired:
        c, pairs = min(
            paired, key=lambda cp: (cp[0].mean_diff if cp[0].mean_diff is not None else math.inf, cp[0].map_key)
        )
        test = UnitTest(level, first_look, max_n, looks_apart(settings.look_every, max_n))
        gap = _plus(unit_detectable_gap(pairs, test, DETECTION_POWER), settings.margin)
        sd = pairs.sd()
        if gap is None or sd is None:
            return None
        ppl = math.exp(base) - math.exp(base - gap) if settings.judged == "ppl" else 0.0
        return DetectableGap(gap, ppl, DETECTION_POWER, len(pairs.chunks), sd, level, pairs.n, settings.judged)
    usable = [(c.n, d) for c in comparisons if c.n >= 2 and (d := c.sd_diff) is not None and d > 0]  # (n, paired sd)
    if not usable:
        return None
    dof = sum(n - 1 for n, _ in usable)
    sd = math.sqrt(math.fsum((n - 1) * s**2 for n, s in usable) / dof)
    n = max(n for n, _ in usable)
    boundary = _sequential(settings, level, first_look, max_n).boundary(n) if settings.test == "spending" else None
    nats = detectable_gap(sd, n, level, DETECTION_POWER, boundary=boundary)
    if nats is None:
        return None
    ppl = math.exp(base) - math.exp(base - nats)
    return DetectableGap(nats, ppl, DETECTION_POWER, n, sd, level, judged=settings.judged)


def _equal_compute(
    deep: str | None, best: str | None, results: Results, target: int, settings: RaceSettings, baseline_key: str
) -> EqualCompute | None:
    """The best contender against the plain model of its compute, over their common target seeds."""
    if deep is None or best is None:
        return None
    mine, theirs = results.at(best, target), results.at(deep, target)
    layers = Map.parse(deep).n_layers
    share = settings.layer_param_share
    iv = seed_interval(by_seed(theirs), settings.confidence) if theirs else None
    c = paired_comparison(mine, theirs, settings.confidence)
    if not c.n or c.mean_diff is None:
        diff = None
    else:
        # the paired difference as ppl at the deeper model's mean over the paired seeds, as the answer says it
        deep_ppl = math.exp(math.fsum(theirs[s] for s in c.seeds) / c.n)
        diff = DeepDiff(
            c.seeds, c.mean_diff, c.sd_diff, c.interval, c.p_value, deep_ppl, -ppl_gain(deep_ppl, c.mean_diff)
        )
    return EqualCompute(
        deep,
        layers,
        best,
        results.flops.get(deep),
        1 + (layers - Map.parse(baseline_key).n_layers) * share if share > 0 else None,
        target,
        tuple(sorted(theirs)),
        iv.val_ppl if iv is not None else None,
        iv.interval_ppl if iv is not None else None,
        diff,
    )


def _why_done(comparisons: Sequence[Comparison], testable: bool, first_look: int, max_n: int, words: Replicates) -> str:
    if not comparisons:
        return "no recurrent contender"
    if not testable:
        return f"the pool has {words.count(max_n, test=True)}; a sequential test needs {first_look}"
    if all(c.status == "better" or c.status in DECIDED_AGAINST for c in comparisons):
        return "every comparison decided"
    return f"the pool's {words.count(max_n, test=True)} were spent"


def _verdict(
    comparisons: Mapping[str, Comparison],
    better: Sequence[str],
    results: Results,
    baseline_key: str,
    target: int,
    settings: RaceSettings,
    done: bool,
    gap: DetectableGap | None,
    equal: EqualCompute | None,
    compute: int,
    stopped: str,
    contenders: Sequence[str],
) -> str:
    """The race's verdict in a few clauses. Every difference is the one the answer gives (answer.ppl_gain: the
    paired mean loss difference over the test seeds, as ppl at the baseline's mean), said in words."""
    words, measure = settings.words, settings.measure
    prefix = "" if done else f"(race open {words.at(target)}) "
    pct = round(settings.confidence * 100)
    base_ppl = math.exp(_mean(results, baseline_key, target))
    parts = []
    if not comparisons:
        text = (
            f"{prefix}no recurrent map was raced: the baseline {baseline_key} is the only contender"
            if contenders == [baseline_key]
            else f"{prefix}no recurrent map reached the {words.plural} {words.at(target)}"
        )
    elif better:
        claims = []
        for k in better:
            c = comparisons[k]
            assert c.mean_diff is not None  # a claimed map was tested
            interval = interval_words(base_ppl, c.interval, settings.confidence, measure)
            gained = side(measure.gain(base_ppl, c.mean_diff), "the baseline", measure)
            claims.append(
                f"{settings.words.shown(k)} {gained} ({interval}, p={c.p_value:.3g}, {words.count(c.n, test=True)})"
            )
        paired = f", paired by {words.paired}" if any(c.units for c in comparisons.values()) else ""
        text = (
            f"{prefix}recurrence beats the baseline {words.at(target)} ({pct}% confidence, sequential paired tests "
            f"on {words.plural} after the screen's{paired}, Holm over {len(comparisons)} map(s)): " + "; ".join(claims)
        )
    else:
        counts = sorted({c.n for c in comparisons.values()})
        seeds = (
            words.count(counts[0], test=True)
            if len(counts) == 1
            else f"{counts[0]} to {words.count(counts[-1], test=True)}"
        )
        text = (
            f"{prefix}nothing here is distinguishable from the baseline {words.at(target)} with {seeds} "
            f"({pct}% confidence)"
        )
    if gap is not None:
        paired = f", {gap.units} {words.paired}s paired" if gap.units else ""
        parts.append(
            f"gaps of {measure.amount(gap.amount)} or more would have been seen with {round(100 * gap.power)}% power "
            f"({words.count(gap.seeds, test=True)}{paired})"
        )
    ranked = [c for c in comparisons.values() if c.map_key not in better and c.mean_diff is not None]
    if comparisons and not better and ranked:
        c = min(ranked, key=lambda c: (c.mean_diff, c.map_key))
        assert c.mean_diff is not None  # ranked holds only the comparisons with a mean difference
        how = (
            f"closest {settings.words.shown(c.map_key)}: "
            f"{side(measure.gain(base_ppl, c.mean_diff), 'the baseline', measure)}"
        )
        need = paired_comparison(*_pair(results, c, baseline_key, target), settings.confidence).seeds_needed()
        if c.units:
            parts.append(how)
        elif c.sd_diff is None:
            parts.append(f"{how} at {words.count(1)}")
        elif need is None:
            parts.append(f"{how}; more than 1000 {words.plural} would be needed to tell them apart")
        else:
            who = f"{c.map_key} beats the baseline" if c.mean_diff < 0 else f"the baseline beats {c.map_key}"
            parts.append(f"{how}; if the gap holds, about {words.count(need)} {words.at(target)} would show {who}")
    if equal is not None and equal.map_minus_deep is not None:
        d = equal.map_minus_deep
        interval = interval_words(d.deep_ppl, d.interval, settings.confidence)
        share = f", {equal.params_ratio:.2f}x the parameters" if equal.params_ratio else ""
        parts.append(
            f"{equal.map} {side(-d.ppl_diff, equal.deep_key)}, a plain {equal.layers}-layer model "
            f"of the same compute{share}" + (f" ({interval})" if interval else "") + f", {len(d.seeds)} seeds"
        )
    spent = (
        f"the race evaluated {words.count(len(_test_chunks(results, settings)))} beyond the screen's"
        if settings.frozen
        else f"the race trained {compute} steps"
    )
    parts.append(spent + (f"; it stopped because {stopped}" if stopped and done else ""))
    return text + "; " + "; ".join(parts)


def _test_chunks(results: Results, settings: RaceSettings) -> set[int]:
    """The test seeds (window chunks) any map has a result at, at the target."""
    return {
        seed
        for by_steps in results.losses.values()
        for seed in by_steps.get(settings.target_steps, {})
        if seed in settings.seeds[1:]
    }


def _pair(results: Results, c: Comparison, baseline_key: str, target: int) -> tuple[dict[int, float], dict[int, float]]:
    mine, base = results.at(c.map_key, target), results.at(baseline_key, target)
    return {s: mine[s] for s in c.seeds}, {s: base[s] for s in c.seeds}
