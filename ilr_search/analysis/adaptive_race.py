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
from dataclasses import dataclass
from typing import Any

from ilr_search.analysis.answer import interval_words, side
from ilr_search.analysis.race_core import (
    CANNOT_WIN,
    DECIDED_AGAINST,
    Comparison,
    DeepDiff,
    DetectableGap,
    EqualCompute,
    Evaluation,
    Measure,
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
    overturned = [
        base_losses[a] - base_losses[b]
        for a in keys
        for b in keys
        if base_losses[b] < base_losses[a] and target_losses[a] < target_losses[b]
    ]
    return ScreenAgreement(len(keys), rho, max(overturned, default=0.0))


@dataclass(frozen=True)
class _Race:
    """What every step of one adaptive race reads: the study's results, the settings, the baseline, the compute
    trained so far, the maps eliminated so far (map -> why; the steps add theirs) and those never chosen for the
    screen; with the target, the test seeds (the pool, seeds[1:]) and the sequential test's looks over them."""

    results: Results
    settings: RaceSettings
    baseline_key: str
    compute: int
    eliminated: dict[str, str]
    not_raced: tuple[str, ...]

    @property
    def target(self) -> int:
        return self.settings.target_steps

    @property
    def pool(self) -> tuple[int, ...]:
        return self.settings.seeds[1:]

    @property
    def first_look(self) -> int:
        return max(2, self.settings.race_seeds - 1)

    @property
    def every(self) -> int:
        return looks_apart(self.settings.look_every, len(self.pool))

    @property
    def cap_reached(self) -> str:
        return f"the compute cap ({self.settings.max_steps} steps) was reached"

    def fits(self, jobs: Sequence[RaceJob], reserve: int = 0) -> bool:
        """Whether training `jobs` (and `reserve` steps more) keeps the race within its compute cap."""
        cap = self.settings.max_steps
        return cap is None or self.compute + sum(j.steps for j in jobs) + reserve <= cap

    def at(self, key: str) -> dict[int, float]:
        return self.results.at(key, self.target)

    def tried(self, key: str) -> Mapping[int, float | None]:
        """A map's results at the target by seed, the diverged ones (None) among them."""
        return self.results.losses.get(key, {}).get(self.target, {})

    def mean(self, key: str) -> float:
        return self.results.mean(key, self.target)

    def sequential(self, level: float) -> SequentialTest:
        """The sequential paired t test of one comparison held to `level`, over the pool's test seeds."""
        return SequentialTest(level, self.first_look, len(self.pool), self.settings.test, every=self.every)

    def unit_test(self, level: float) -> UnitTest:
        """The sequential test of a comparison paired by unit (a frozen race's), held to `level`."""
        return UnitTest(level, self.first_look, len(self.pool), self.every)

    def unit_gap(self, pairs: UnitPairs, level: float) -> float | None:
        """The gap the unit test at `level` finds with 80% power, beyond the claims' margin (RaceSettings.margin)."""
        gap = unit_detectable_gap(pairs, self.unit_test(level), DETECTION_POWER)
        return None if gap is None else gap + self.settings.margin

    def diffs(self, key: str) -> tuple[list[int], list[float]]:
        """The test seeds a map shares with the baseline at the target, in pool order, and its loss differences."""
        mine, base = self.at(key), self.at(self.baseline_key)
        seeds = [s for s in self.pool if s in mine and s in base]
        return seeds, [mine[s] - base[s] for s in seeds]

    def by_unit(self, key: str, other: str, seeds: Sequence[int]) -> UnitPairs | None:
        """A frozen comparison's unit pairs (unit_pairs.py) of `key` against `other` over their common seeds
        (chunks), where every one of them kept both maps' per-unit scores; None otherwise (a trained race, or runs
        stored without their scores: paired by seed)."""
        if not self.settings.frozen or not seeds:
            return None
        mine = {s: self.results.units(key, self.target, s) for s in seeds}
        theirs = {s: self.results.units(other, self.target, s) for s in seeds}
        pairs = unit_pairs(mine, theirs, seeds, self.settings.binary)
        return pairs if pairs.chunks == tuple(seeds) else None

    def state(self, **fields: Any) -> RaceState:
        """The race's state at the target, with what every state of it carries (eliminations, compute)."""
        return RaceState(
            eliminated=self.eliminated,
            not_raced=self.not_raced,
            level_steps=self.target,
            compute_steps=self.compute,
            **fields,
        )

    def ended(self, verdict: str) -> RaceState:
        return self.state(alive=(), done=True, verdict=verdict, stopped=verdict)


def adaptive_race_state(evaluations: Sequence[Evaluation], settings: RaceSettings, baseline_key: str) -> RaceState:
    """The adaptive race's decision from every evaluation (see the module docstring)."""
    maps = [e for e in evaluations if Map.form_of(e.map_key) != "deeper"]  # the equal-compute models are no contenders
    _, early, base_losses, eliminated = base_results(maps, settings, baseline_key)
    if early is not None:
        return early
    results = collect(evaluations)
    target, first, words = settings.target_steps, settings.seeds[0], settings.words
    # 2. the screen at the target, at seeds[0]
    candidates = choose_contenders(base_losses, results.flops, baseline_key, settings.race_screen)
    not_raced = tuple(k for k in sorted(base_losses) if k not in candidates)
    race = _Race(results, settings, baseline_key, race_compute(evaluations, settings), eliminated, not_raced)
    screened = [k for k in candidates if first in race.tried(k)]
    screen_losses: dict[str, float] = {}
    for k in screened:
        loss = race.tried(k)[first]
        if loss is not None and math.isfinite(loss):
            screen_losses[k] = float(loss)
        else:
            eliminated[k] = f"diverged {words.at(target)}, {words.one(first)}"
    if baseline_key in screened and baseline_key not in screen_losses:
        return race.ended(f"the baseline {baseline_key} diverged {words.at(target)}: nothing to race against")
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
    candidate_losses = {k: base_losses[k] for k in candidates}
    screen = Screen(tuple(candidates), tuple(sorted(screen_losses)), agreement, candidate_losses, dict(screen_losses))
    if waiting:
        wave = [RaceJob(k, target, first) for k in waiting[: max(1, settings.calibration)]]
        if race.fits(wave):
            return race.state(
                alive=tuple(waiting),
                next_jobs=tuple(wave),
                screen=screen,
                verdict=f"(race open {words.at(target)}) screening {len(waiting)} map(s) at {words.one(first)}",
            )
        screen = dataclasses.replace(screen, capped=tuple(waiting))
        for k in waiting:
            eliminated[k] = f"not screened: {race.cap_reached}"

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
    family = [k for k in contenders if k != baseline_key]
    alpha = decision_level(settings.confidence)
    testable = len(race.pool) >= race.first_look
    paths = {k: race.diffs(k) for k in family}
    units = {k: race.by_unit(k, baseline_key, paths[k][0]) for k in family}
    weights = holm_weights(sorted(family, key=lambda k: (screen_losses[k], k)), settings.lead_share)

    def crossed(key: str, level: float) -> int | None:
        pairs = units[key]
        if pairs is not None:
            return race.unit_test(level).crossed_at(pairs.shifted(settings.margin))
        return race.sequential(level).crossed_at(paths[key][1])

    claims, open_levels = holm_claims(family, weights, alpha, crossed) if testable and family else ({}, {})
    comparisons = {
        k: _compare(race, k, paths[k], claims.get(k, (open_levels.get(k, alpha * weights[k]), None)), units[k])
        for k in family
    }
    if not settings.two_sided:  # a judge judges each candidate against the baseline alone
        _stop_dominated(race, comparisons)
    eliminated |= {k: c.why for k, c in comparisons.items() if c.status in DECIDED_AGAINST}
    # 5. the equal-compute model of the best recurrent contender
    best = _best_recurrent(race, comparisons)
    deep = (
        Map.of_deeper(Map.parse(best, Map.parse(baseline_key).n_layers).layer_runs).key
        if settings.equal_compute and best is not None
        else None
    )
    jobs = _seed_wave(race, comparisons) if testable else []
    stopped = ""
    if jobs and not race.fits(jobs, sum(j.steps for j in _deep_jobs(race, deep, best, jobs))):
        stopped = race.cap_reached
        for k, c in comparisons.items():
            if c.status == "open":
                comparisons[k] = dataclasses.replace(c, status="capped", why=stopped)
        jobs = []
    if not jobs:
        deep_jobs = _deep_jobs(race, deep, best, [])
        if deep_jobs and race.fits(deep_jobs):
            jobs = deep_jobs
        elif deep_jobs:
            stopped = stopped or race.cap_reached
    done = not jobs
    if done and not stopped:
        stopped = _why_done(race, list(comparisons.values()), testable)
    alive = sorted((k for k in contenders if k not in eliminated), key=lambda k: (race.mean(k), k))
    better = tuple(sorted(claims, key=lambda k: (comparisons[k].mean_diff or 0.0, k)))
    gap = _detectable(race, list(comparisons.values()), units)
    equal = _equal_compute(race, deep, best)
    return race.state(
        alive=tuple(alive),
        next_jobs=tuple(jobs),
        front=tuple(loss_front(alive, results, target, settings.confidence, confirmed=tuple(claims))),
        verdict=_verdict(race, comparisons, better, contenders, done, gap, equal, stopped),
        done=done,
        confirmed_better=better,
        best=min(better, key=lambda k: (race.mean(k), k)) if better else baseline_key,
        comparisons=tuple(comparisons.values()),
        screen=screen,
        equal_compute=equal,
        detectable_gap=gap,
        stopped=stopped,
    )


def _compare(
    race: _Race, key: str, path: tuple[list[int], list[float]], claim: tuple[float, int | None], pairs: UnitPairs | None
) -> Comparison:
    """A contender's comparison with the baseline over its test seeds, held to its Holm `claim` (its level, and the
    look at which its test claimed it better, None where it did not): paired by unit where `pairs` (a frozen race),
    else by seed (`path`: the test seeds and the loss differences there). Its status: better (claimed), worse (a
    judge's test run the other way claimed the baseline better), cannot win (the futility rule), undecided (the
    pool is spent) or open; diverged, whatever the test said, where a run of it at a test seed diverged."""
    settings, words, at = race.settings, race.settings.words, race.settings.words.at(race.target)
    (seeds, diffs), (level, decided_at) = path, claim
    tested = len(seeds) >= race.first_look
    judged_worse = settings.two_sided and decided_at is None
    numbers: dict[str, Any] = dict(map_key=key, flops_ratio=race.results.flops[key], seeds=tuple(seeds), level=level)
    if pairs is not None:  # frozen, paired by unit over the chunks
        test = race.unit_test(level)
        numbers |= dict(
            mean_diff=pairs.mean(),
            sd_diff=pairs.sd(),
            interval=test.interval(pairs),  # the sequential test's own: it cannot contradict its decision
            p_value=pairs.p_value(),
            t=pairs.statistic(),
            boundary=test.boundary(pairs) if tested else None,
            units=pairs.n,
            detectable=race.unit_gap(pairs, level),
        )
        dof = max(1, pairs.n - 1)
        worse_at = test.crossed_at(pairs.reversed().shifted(settings.margin)) if judged_worse else None
        unit_words = f" ({pairs.n} {words.paired}s paired)"
        worse_test = f"the sequential test paired by {words.paired}"
        claim_test = (
            "an exact sequential sign test paired by item"
            if pairs.binary
            else f"a sequential t test paired by {words.paired}"
        )
    else:
        mine, base = race.at(key), race.at(race.baseline_key)
        c = paired_comparison({s: mine[s] for s in seeds}, {s: base[s] for s in seeds}, settings.confidence)
        seed_test = race.sequential(level)
        numbers |= dict(
            mean_diff=c.mean_diff if seeds else None,
            sd_diff=c.sd_diff,
            interval=c.interval,
            p_value=c.p_value,
            t=t_statistic(diffs),
            boundary=seed_test.boundary(len(seeds)) if settings.test == "spending" and tested else None,
        )
        dof = len(seeds) - 1
        worse_at = seed_test.crossed_at([-d for d in diffs]) if judged_worse and tested else None
        unit_words, worse_test, claim_test = "", "the sequential paired t test", "a sequential paired t test"
    t, mean_diff = numbers["t"], numbers["mean_diff"]
    futile = t is not None and tested and not settings.two_sided
    bound = _futility_bound(settings.futility, dof) if futile else math.inf
    status, why = "open", ""
    if decided_at is not None:
        status = "better"
        why = (
            f"better than the baseline {at}: {claim_test} at level {level:.3g} claimed it after "
            f"{words.count(decided_at)}"
        )
    elif worse_at is not None:
        status, decided_at = "worse", worse_at
        why = (
            f"worse than the baseline {at}: {worse_test} at level {level:.3g}, run the other way, claimed the "
            f"baseline better after {words.count(worse_at)}{unit_words}"
        )
    elif futile and t < -bound:
        status = CANNOT_WIN
        why = (
            f"stopped: cannot win against the baseline {at}: its loss is {mean_diff:.4f} above the baseline's on "
            f"average over {words.count(len(seeds))}{unit_words}, {-t:.2f} standard errors past even, more than the "
            f"{bound:.2f} at which a later claim becomes unlikely (futility level {settings.futility:g})"
        )
    elif len(seeds) >= len(race.pool):
        status, why = "undecided", f"undecided after the pool's {words.count(len(race.pool), test=True)}"
    diverged = [s for s in race.results.diverged_at(key, race.target) if s in race.pool]
    if diverged:  # a diverged run ends the comparison whatever its test said (the test's numbers are kept)
        status, why = "diverged", f"diverged {at}, {words.one(diverged[0])}"
    return Comparison(**numbers, status=status, decided_at=decided_at, why=why)


def _futility_bound(futility: float, dof: int) -> float:
    """The t past which a contender trails the baseline too far to win: the one-sided level `futility`'s."""
    from scipy.stats import t as student

    return float(student.ppf(1 - futility, dof))


def _stop_dominated(race: _Race, comparisons: dict[str, Comparison]) -> None:
    """An open contender that a contender of no more FLOPs beats by a paired test over their common test seeds
    gets no more seeds (it cannot be on the front)."""
    settings, flops = race.settings, race.results.flops
    alpha = decision_level(settings.confidence)
    for k, c in list(comparisons.items()):
        if c.status != "open":
            continue
        mine = {s: v for s, v in race.at(k).items() if s in race.pool}
        for o in sorted(comparisons, key=lambda x: (flops[x], x)):
            if o == k or flops[o] > flops[k]:
                continue
            theirs = {s: v for s, v in race.at(o).items() if s in race.pool}
            common = sorted(set(mine) & set(theirs), key=settings.seeds.index)
            pairs = race.by_unit(o, k, common) if c.units else None
            if pairs is not None:
                n, mean_diff, p = len(pairs.chunks), pairs.mean(), pairs.p_value()
            else:
                test = paired_comparison(theirs, mine, settings.confidence)
                n, mean_diff, p = test.n, test.mean_diff, test.p_value
            if n >= race.first_look and p < alpha and mean_diff is not None:
                why = (
                    f"{o} better than {k} {settings.words.at(race.target)}: loss difference {mean_diff:+.4f} over "
                    f"{settings.words.count(n)}, one-sided paired {'test' if pairs is not None else 't'} p={p:.3g} "
                    f"< {alpha:.3g}"
                )
                comparisons[k] = dataclasses.replace(c, status="dominated", why=why)
                break


def _seed_wave(race: _Race, comparisons: Mapping[str, Comparison]) -> list[RaceJob]:
    """The next wave: every open contender's first first_look test seeds at once, then the seeds up to its test's
    next look (`every` more); the baseline gets every seed of the wave it lacks. A comparison counts the seeds that
    both sides have (its test's), so a contender whose run finished before the baseline's at that seed waits for it
    instead of buying the next, and one at its look waits for every open one to reach theirs: the race trains what
    the wave-by-wave replay trains, whatever the timing. Jobs best mean first, the baseline first of all."""
    pool, first_look, target = race.pool, race.first_look, race.target
    open_keys = sorted((k for k, c in comparisons.items() if c.status == "open"), key=lambda k: (race.mean(k), k))
    looks = look_schedule(first_look, len(pool), race.every)
    base = race.tried(race.baseline_key)
    unpaired = {k: [s for s in pool if s not in race.tried(k) or s not in base] for k in open_keys}
    # the comparisons share the family's level (a claim passes its share on), so one that has reached its look
    # waits until every open one has: each look sees the others' decisions at the same seeds, as in the replay
    level = min((len(pool) - len(v) for v in unpaired.values()), default=0)
    wanted: dict[str, list[int]] = {}
    for k in open_keys:
        trained = len(pool) - len(unpaired[k])
        if trained > level:
            wanted[k] = []
            continue
        step = (next_look(looks, trained) or len(pool)) - trained
        wanted[k] = (
            [s for s in unpaired[k] if pool.index(s) < first_look]
            if trained < first_look
            else unpaired[k][: max(1, step)]
        )
    seeds = sorted({s for v in wanted.values() for s in v}, key=pool.index)
    jobs = [RaceJob(race.baseline_key, target, s) for s in seeds if s not in base]
    return jobs + [RaceJob(k, target, s) for k in open_keys for s in wanted[k] if s not in race.tried(k)]


def _best_recurrent(race: _Race, comparisons: Mapping[str, Comparison]) -> str | None:
    """The recurrent contender with the lowest mean loss at the target (claims first)."""
    keys = [k for k, c in comparisons.items() if c.status != "diverged"]
    if not keys:
        return None
    return min(keys, key=lambda k: (comparisons[k].status != "better", race.mean(k), k))


def _deep_jobs(race: _Race, deep: str | None, best: str | None, wave: Sequence[RaceJob]) -> list[RaceJob]:
    """The equal-compute model's jobs: the best contender's target seeds (after `wave`) it lacks."""
    if deep is None or best is None:
        return []
    seeds = set(race.tried(best)) | {j.seed for j in wave if j.map_key == best}
    return [RaceJob(deep, race.target, s) for s in sorted(seeds) if s not in race.tried(deep)]


def _detectable(
    race: _Race, comparisons: Sequence[Comparison], units: Mapping[str, UnitPairs | None]
) -> DetectableGap | None:
    """The smallest gap the race would have found with 80% power, at the level of the screen's best (the largest
    share of the family's). Paired by seed: at the most test seeds any comparison reached, with the race's paired sd
    (pooled over its comparisons), against the sequential boundary there. Paired by unit (a frozen race): from the
    unit differences of the comparison nearest the baseline (the smallest mean difference), whose spread is the
    one a map that could win would have, at the chunks it reached (a map far behind has a spread of its own)."""
    settings = race.settings
    level = max((c.level for c in comparisons), default=0.0)
    paired = [(c, pairs) for c in comparisons if (pairs := units.get(c.map_key)) is not None and c.n >= 1]
    sd: float | None
    if paired:
        _, pairs = min(
            paired, key=lambda cp: (cp[0].mean_diff if cp[0].mean_diff is not None else math.inf, cp[0].map_key)
        )
        nats, sd, n, paired_units = race.unit_gap(pairs, level), pairs.sd(), len(pairs.chunks), pairs.n
    else:
        usable = [(c.n, d) for c in comparisons if c.n >= 2 and (d := c.sd_diff) is not None and d > 0]  # (n, sd)
        if not usable:
            return None
        dof = sum(n - 1 for n, _ in usable)
        sd = math.sqrt(math.fsum((n - 1) * s**2 for n, s in usable) / dof)
        n = max(n for n, _ in usable)
        boundary = race.sequential(level).boundary(n) if settings.test == "spending" else None
        nats, paired_units = detectable_gap(sd, n, level, DETECTION_POWER, boundary=boundary), 0
    if nats is None or sd is None:
        return None
    base = race.mean(race.baseline_key)
    ppl = math.exp(base) - math.exp(base - nats) if settings.judged == "ppl" or not paired else 0.0
    return DetectableGap(nats, ppl, DETECTION_POWER, n, sd, level, paired_units, settings.judged)


def _equal_compute(race: _Race, deep: str | None, best: str | None) -> EqualCompute | None:
    """The best contender against the plain model of its compute, over their common target seeds."""
    if deep is None or best is None:
        return None
    mine, theirs = race.at(best), race.at(deep)
    layers = Map.parse(deep).n_layers
    share = race.settings.layer_param_share
    iv = seed_interval(by_seed(theirs), race.settings.confidence) if theirs else None
    c = paired_comparison(mine, theirs, race.settings.confidence)
    if not c.n or c.mean_diff is None:
        diff = None
    else:
        # the paired difference as ppl at the deeper model's mean over the paired seeds, as the answer says it
        deep_ppl = math.exp(math.fsum(theirs[s] for s in c.seeds) / c.n)
        ppl_diff = -Measure().gain(deep_ppl, c.mean_diff)
        diff = DeepDiff(c.seeds, c.mean_diff, c.sd_diff, c.interval, c.p_value, deep_ppl, ppl_diff)
    params_ratio = 1 + (layers - Map.parse(race.baseline_key).n_layers) * share if share > 0 else None
    seeds, flops = tuple(sorted(theirs)), race.results.flops.get(deep)
    val_ppl, interval = (iv.val_ppl, iv.interval_ppl) if iv is not None else (None, None)
    return EqualCompute(deep, layers, best, flops, params_ratio, race.target, seeds, val_ppl, interval, diff)


def _why_done(race: _Race, comparisons: Sequence[Comparison], testable: bool) -> str:
    words, max_n = race.settings.words, len(race.pool)
    if not comparisons:
        return "no recurrent contender"
    if not testable:
        return f"the pool has {words.count(max_n, test=True)}; a sequential test needs {race.first_look}"
    if all(c.status == "better" or c.status in DECIDED_AGAINST for c in comparisons):
        return "every comparison decided"
    return f"the pool's {words.count(max_n, test=True)} were spent"


def _verdict(
    race: _Race,
    comparisons: Mapping[str, Comparison],
    better: Sequence[str],
    contenders: Sequence[str],
    done: bool,
    gap: DetectableGap | None,
    equal: EqualCompute | None,
    stopped: str,
) -> str:
    """The race's verdict in a few clauses. Every difference is the one the answer gives (Measure.gain: the paired
    mean loss difference over the test seeds, as ppl at the baseline's mean), said in words."""
    settings, baseline_key, target = race.settings, race.baseline_key, race.target
    words, measure = settings.words, settings.measure
    prefix = "" if done else f"(race open {words.at(target)}) "
    pct = round(settings.confidence * 100)
    base_ppl = math.exp(race.mean(baseline_key))
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
            claims.append(f"{words.shown(k)} {gained} ({interval}, p={c.p_value:.3g}, {words.count(c.n, test=True)})")
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
        how = f"closest {words.shown(c.map_key)}: {side(measure.gain(base_ppl, c.mean_diff), 'the baseline', measure)}"
        mine, base = race.at(c.map_key), race.at(baseline_key)
        paired_seeds = ({s: mine[s] for s in c.seeds}, {s: base[s] for s in c.seeds})
        need = paired_comparison(*paired_seeds, settings.confidence).seeds_needed()
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
    if settings.frozen:
        test_chunks = {s for k in race.results.losses for s in race.tried(k) if s in race.pool}
        spent = f"the race evaluated {words.count(len(test_chunks))} beyond the screen's"
    else:
        spent = f"the race trained {race.compute} steps"
    parts.append(spent + (f"; it stopped because {stopped}" if stopped and done else ""))
    return text + "; " + "; ".join(parts)
