"""Racing reuse maps across seeds and training lengths: a pure policy over stored evaluations.

Every evaluation of a map is one (map, steps, seed) result. The policy reads all of them and says which
contenders are still open, which jobs to train next (more seeds, then longer training), which maps are
eliminated (a paired test shows a map at no more FLOPs better at the current length), and what the front at
the target length is, with intervals and whether each point is confirmed. It keeps no state of its own:
the same evaluations give the same decision, so a resumed study, a second worker and `bench replay` agree.

Decisions use the paired statistics of stats.py (seed s is the same init and batch order for every map, so maps
are compared seed by seed): "a beats b" means the paired t interval of the loss difference at the race's
confidence lies below zero, over at least 2 common seeds. Eliminations test each map against every map at no
more FLOPs; the claims made together at the end (the maps that beat the baseline, the front's confirmations)
are Benjamini-Hochberg adjusted, so that the share of false ones among them stays within the test's level.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ilr_search.analysis.pareto import non_dominated, non_dominated_ranks
from ilr_search.analysis.stats import PairedComparison, decision_level, paired_comparison, seed_interval


@dataclass(frozen=True)
class Evaluation:
    """One trained result: map `map_key` trained for `steps` steps at `seed`; val_loss None when it diverged."""
    map_key: str
    flops_ratio: float
    steps: int
    seed: int
    val_loss: float | None


@dataclass(frozen=True)
class RaceJob:
    """A result the race still needs: train `map_key` for `steps` steps at `seed`."""
    map_key: str
    steps: int
    seed: int


@dataclass(frozen=True)
class RaceSettings:
    """base_steps: the proxy's length (every map's first result); target_steps: the length the verdict is
    about; lengths in between are doubled from base_steps. seeds: the seeds a contender is raced on, first
    at the base length. confidence: of the paired tests and the intervals (two-sided)."""
    base_steps: int
    target_steps: int
    seeds: tuple[int, ...] = (0, 1, 2)
    confidence: float = 0.9
    max_contenders: int = 6


@dataclass(frozen=True)
class FrontPoint:
    """A front point at its longest raced length: the mean over its seeds, with an interval (low, high ppl)."""
    map_key: str
    flops_ratio: float
    steps: int
    seeds: tuple[int, ...]
    val_ppl: float
    interval: tuple[float, float]
    confirmed: bool


@dataclass(frozen=True)
class RaceState:
    """alive: the contenders still raced, best first; eliminated: map_key -> why (the test that eliminated it,
    or the base result that a map never started the race with: a diverged run); not_raced: the maps with a base
    result that were not chosen as contenders; next_jobs: what to train now (every job of the open wave; after
    they are trained, ask again); level_steps: the length being raced now (the target once done); front, verdict,
    done: see race_state."""
    alive: tuple[str, ...]
    eliminated: dict[str, str] = field(default_factory=dict)  # map_key -> why (the test that eliminated it)
    next_jobs: tuple[RaceJob, ...] = ()
    front: tuple[FrontPoint, ...] = ()
    verdict: str = ""
    done: bool = False
    not_raced: tuple[str, ...] = ()
    level_steps: int = 0
    confirmed_better: tuple[str, ...] = ()  # maps that beat the baseline at the target by a paired test
    best: str | None = None  # the map the race reports: see reported_best


def race_lengths(settings: RaceSettings) -> tuple[int, ...]:
    """base, 2 base, 4 base, ... below the target, then the target itself."""
    if settings.base_steps < 1 or settings.target_steps < settings.base_steps:
        raise ValueError(f"the target ({settings.target_steps} steps) must be at least the base length "
                         f"({settings.base_steps} steps)")
    lengths = []
    steps = settings.base_steps
    while steps < settings.target_steps:
        lengths.append(steps)
        steps *= 2
    return tuple(lengths) + (settings.target_steps,)


@dataclass(frozen=True)
class _Results:
    """The evaluations by map: flops, and {steps: {seed: val_loss}} (None where the run diverged)."""
    flops: dict[str, float]
    losses: dict[str, dict[int, dict[int, float | None]]]

    def at(self, key: str, steps: int) -> dict[int, float]:
        """A map's finite losses at one length, by seed."""
        return {s: v for s, v in self.losses.get(key, {}).get(steps, {}).items() if v is not None and math.isfinite(v)}

    def diverged_at(self, key: str, steps: int) -> list[int]:
        return sorted(s for s, v in self.losses.get(key, {}).get(steps, {}).items() if v is None or not math.isfinite(v))


def _collect(evaluations: Sequence[Evaluation]) -> _Results:
    flops: dict[str, float] = {}
    losses: dict[str, dict[int, dict[int, float | None]]] = {}
    for e in evaluations:
        flops[e.map_key] = e.flops_ratio
        losses.setdefault(e.map_key, {}).setdefault(e.steps, {})[e.seed] = e.val_loss
    return _Results(flops, losses)


def choose_contenders(base_losses: Mapping[str, float], flops: Mapping[str, float], baseline_key: str,
                      max_contenders: int) -> list[str]:
    """The maps nearest the base front: by non-dominated rank in (loss, flops) at the base length and first
    seed, then by loss, then by key (reproducible); at most max_contenders, the baseline always among them."""
    keys = sorted(base_losses)
    ranks = non_dominated_ranks([(base_losses[k], flops[k]) for k in keys])
    order = sorted(range(len(keys)), key=lambda i: (ranks[i], base_losses[keys[i]], keys[i]))
    chosen = [keys[i] for i in order if keys[i] != baseline_key][:max(0, max_contenders - 1)]
    return [baseline_key] + chosen if baseline_key in base_losses else chosen


def _describe(c: PairedComparison, winner: str, loser: str, steps: int) -> str:
    assert c.interval is not None
    return (f"{winner} better than {loser} at {steps} steps: loss difference {c.mean_diff:+.4f} "
            f"(interval {c.interval[0]:+.4f} to {c.interval[1]:+.4f}) over seeds "
            f"{','.join(map(str, c.seeds))}, one-sided paired t p={c.p_value:.3g} < {c.alpha:.3g}")


def _eliminations(entering: Sequence[str], results: _Results, steps: int, settings: RaceSettings,
                  baseline_key: str) -> dict[str, str]:
    """The maps entering a length that a map at no more FLOPs beats there by a paired test (>= 2 common seeds,
    at the race's confidence), with the test that shows it; the baseline is never eliminated. Witnesses are
    tried in order of FLOPs, then key, so the reason given is reproducible."""
    out: dict[str, str] = {}
    for key in entering:
        if key == baseline_key:
            continue
        for other in sorted(entering, key=lambda k: (results.flops[k], k)):
            if other == key or results.flops[other] > results.flops[key]:
                continue
            c = paired_comparison(results.at(other, steps), results.at(key, steps), settings.confidence)
            if c.a_better:
                out[key] = _describe(c, other, key, steps)
                break
    return out


def _rank(keys: Sequence[str], results: _Results, lengths: Sequence[int]) -> list[str]:
    """Best mean loss at the last of `lengths` first; maps with no result there by their mean at the length
    before, and so on; then by key."""
    def means(k: str) -> tuple[float, ...]:
        out = []
        for steps in reversed(lengths):
            losses = results.at(k, steps)
            out.append(math.fsum(losses.values()) / len(losses) if losses else math.inf)
        return tuple(out)
    return sorted(keys, key=lambda k: (means(k), k))


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (scipy.stats.false_discovery_control): a family of claims made at
    once ("these maps beat the baseline") keeps its expected share of false ones below the decision level."""
    if not p_values:
        return []
    from scipy.stats import false_discovery_control

    return [float(p) for p in false_discovery_control(list(p_values))]


def race_state(evaluations: Sequence[Evaluation], settings: RaceSettings, baseline_key: str) -> RaceState:
    """The race's decision from every stored evaluation (see the module docstring).

    1. Every map with an evaluation (and the baseline) needs its base-length result at seeds[0]; until all
       have one, those are the only jobs (the contenders are chosen from them).
    2. Contenders: choose_contenders over the base results (a diverged base result is eliminated).
    3. Lengths race_lengths(settings) in order. At each, the maps entering it are raced seed by seed: a wave
       is every entering map's next missing seed (seeds in order), and after each wave the paired tests
       eliminate the maps a map at no more FLOPs beats (a run that diverges at a length is eliminated too).
       Once every survivor has all seeds at a length they are promoted to the next one (seeds before
       length, lengths in order, jobs listed best map first).
    4. Done when the survivors have every seed at the target, or when the baseline alone survives (nothing
       left can change the verdict).
    """
    lengths = race_lengths(settings)
    if not settings.seeds:
        raise ValueError("the race needs at least one seed")
    results = _collect(evaluations)
    base, first_seed = lengths[0], settings.seeds[0]
    known = sorted(set(results.losses) | {baseline_key})
    missing_base = [k for k in known if first_seed not in results.losses.get(k, {}).get(base, {})]
    if missing_base:
        return RaceState(alive=(), next_jobs=tuple(RaceJob(k, base, first_seed) for k in missing_base),
                         level_steps=base, verdict=f"waiting for the base results ({base} steps, seed {first_seed}) "
                                                   f"of {len(missing_base)} map(s)")
    eliminated: dict[str, str] = {}
    base_losses: dict[str, float] = {}
    for k in known:
        loss = results.losses[k][base][first_seed]
        if loss is None or not math.isfinite(loss):
            eliminated[k] = f"diverged at {base} steps, seed {first_seed}"
        else:
            base_losses[k] = loss
    if baseline_key not in base_losses:
        return RaceState(alive=(), eliminated=eliminated, level_steps=base, done=True,
                         verdict=f"the baseline {baseline_key} diverged at {base} steps: nothing to race against")
    contenders = choose_contenders(base_losses, results.flops, baseline_key, settings.max_contenders)
    not_raced = tuple(k for k in sorted(base_losses) if k not in contenders)
    alive = list(contenders)
    jobs: list[RaceJob] = []
    level = lengths[0]
    for level in lengths:
        for k in list(alive):
            bad = [s for s in results.diverged_at(k, level) if s in settings.seeds]
            if bad and k != baseline_key:
                eliminated[k] = f"diverged at {level} steps, seed {bad[0]}"
                alive.remove(k)
        for k, why in _eliminations(alive, results, level, settings, baseline_key).items():
            eliminated[k] = why
            alive.remove(k)
        if alive == [baseline_key]:
            break  # nothing left can change the verdict
        missing = {k: [s for s in settings.seeds if s not in results.losses.get(k, {}).get(level, {})] for k in alive}
        if any(missing.values()):
            wave_seed = min((settings.seeds.index(m[0]) for m in missing.values() if m))
            seed = settings.seeds[wave_seed]
            jobs = [RaceJob(k, level, seed) for k in _rank(alive, results, lengths[:lengths.index(level) + 1])
                    if seed in missing[k]]
            break
    alive = _rank(alive, results, lengths[:lengths.index(level) + 1])
    done = not jobs
    front, confirmed_better, verdict = _report(alive, results, settings, baseline_key, level, done, eliminated)
    return RaceState(alive=tuple(alive), eliminated=eliminated, next_jobs=tuple(jobs), front=front, verdict=verdict,
                     done=done, not_raced=not_raced, level_steps=level, confirmed_better=confirmed_better,
                     best=reported_best(front, alive))


def reported_best(front: Sequence[FrontPoint], alive: Sequence[str]) -> str | None:
    """The best map the evidence supports: the lowest-perplexity confirmed front point (better than every cheaper
    point by the paired tests), so that a map whose lead is within the noise is not reported over a cheaper one
    it has not beaten; with no confirmed point, the best mean among the survivors."""
    confirmed = [p for p in front if p.confirmed]
    if confirmed:
        return min(confirmed, key=lambda p: (p.val_ppl, p.map_key)).map_key
    return alive[0] if alive else None


def _front(alive: Sequence[str], results: _Results, steps: int, confidence: float) -> tuple[FrontPoint, ...]:
    """The non-dominated alive maps at `steps` by (mean loss, flops), cheapest first; confirmed: a paired test
    shows it better than every cheaper front point, the p-values of all the front's tests adjusted together
    (Benjamini-Hochberg); the cheapest point is confirmed when it has >= 2 seeds."""
    keys = [k for k in alive if results.at(k, steps)]
    intervals = {k: seed_interval(list(results.at(k, steps).values()), confidence) for k in keys}
    idx = non_dominated([(intervals[k].mean_loss, results.flops[k]) for k in keys])
    on_front = sorted((keys[i] for i in idx), key=lambda k: (results.flops[k], intervals[k].mean_loss, k))
    pairs = [(k, c) for i, k in enumerate(on_front) for c in on_front[:i]]
    tests = [paired_comparison(results.at(k, steps), results.at(c, steps), confidence) for k, c in pairs]
    adjusted = dict(zip(pairs, benjamini_hochberg([t.p_value for t in tests])))
    enough = {pair: t.n >= 2 for pair, t in zip(pairs, tests)}
    points = []
    for i, k in enumerate(on_front):
        iv = intervals[k]
        confirmed = iv.n >= 2 and all(enough[(k, c)] and adjusted[(k, c)] < decision_level(confidence) for c in on_front[:i])
        points.append(FrontPoint(map_key=k, flops_ratio=results.flops[k], steps=steps,
                                 seeds=tuple(sorted(results.at(k, steps))), val_ppl=iv.val_ppl,
                                 interval=iv.interval_ppl or (0.0, math.inf), confirmed=confirmed))
    return tuple(points)


def _report(alive: Sequence[str], results: _Results, settings: RaceSettings, baseline_key: str, steps: int,
            done: bool, eliminated: Mapping[str, str]) -> tuple[tuple[FrontPoint, ...], tuple[str, ...], str]:
    """The front at the length reached, the maps confirmed better than the baseline there, and the verdict."""
    front = _front(alive, results, steps, settings.confidence)
    base = results.at(baseline_key, steps)
    prefix = "" if done else f"(race open at {steps} steps) "
    pct = round(settings.confidence * 100)
    if alive == [baseline_key] and not eliminated:
        return front, (), f"{prefix}no recurrent map was raced: the baseline {baseline_key} is the only contender"
    if alive == [baseline_key]:
        return front, (), (f"{prefix}no recurrent map beats the baseline {baseline_key}: every contender was "
                           f"eliminated by a paired test at {steps} steps or less ({pct}% confidence, "
                           f"{len(eliminated)} eliminated)")
    comparisons = {k: paired_comparison(results.at(k, steps), base, settings.confidence)
                   for k in alive if k != baseline_key}
    keys = sorted(comparisons)
    adjusted = dict(zip(keys, benjamini_hochberg([comparisons[k].p_value for k in keys])))
    better = tuple(sorted((k for k in keys if comparisons[k].n >= 2 and adjusted[k] < decision_level(settings.confidence)),
                          key=lambda k: (comparisons[k].mean_diff, k)))
    base_ppl = math.exp(math.fsum(base.values()) / len(base)) if base else math.nan
    if better:
        parts = []
        for k in better:
            ppl = math.exp(math.fsum(results.at(k, steps).values()) / len(results.at(k, steps)))
            c = comparisons[k]
            parts.append(f"{k} {ppl:.4f} ppl vs {base_ppl:.4f} ({ppl - base_ppl:+.4f} ppl, "
                         f"{100 * (ppl / base_ppl - 1):+.2f}%, adjusted p={adjusted[k]:.3g} over {c.n} seeds)")
        return front, better, (f"{prefix}recurrence beats the baseline at {steps} steps ({pct}% paired t intervals, "
                               f"Benjamini-Hochberg over {len(keys)} maps): " + "; ".join(parts))
    n_seeds = len(base)
    text = (f"{prefix}nothing here is distinguishable from the baseline at {steps} steps with {n_seeds} seed"
            f"{'s' if n_seeds != 1 else ''} ({pct}% confidence)")
    ranked = [k for k in alive if k != baseline_key and comparisons[k].n > 0]
    if not ranked:
        return front, (), text
    best = min(ranked, key=lambda k: (comparisons[k].mean_diff, k))
    c = comparisons[best]
    gap = math.exp(math.fsum(results.at(best, steps).values()) / len(results.at(best, steps))) - base_ppl
    need = c.seeds_needed()
    if c.sd_diff is None:
        text += f"; closest {best} ({gap:+.4f} ppl at one seed): a second seed would give a spread"
    elif need is None:
        text += (f"; closest {best} ({gap:+.4f} ppl, sd of the paired difference {c.sd_diff:.4f}): more than "
                 f"1000 seeds would be needed to tell them apart")
    else:
        who = f"{best} beats" if c.mean_diff < 0 else f"the baseline beats {best}"
        text += (f"; closest {best} ({gap:+.4f} ppl, sd of the paired loss difference {c.sd_diff:.4f}): if the gap "
                 f"holds, {need} seeds at {steps} steps ({need * steps} steps per map) would show {who}")
    return front, (), text
