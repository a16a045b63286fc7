"""The fixed race: every contender at a fixed number of seeds at each length doubled from the base up to the target,
with eliminations at every length. Studies made before the adaptive race (adaptive_race.py) keep it.

Decisions use the paired statistics of stats.py (seed s is the same init and batch order for every map, so maps
are compared seed by seed): "a beats b" means the paired t interval of the loss difference at the race's
confidence lies below zero, over at least 2 common seeds. Eliminations test each map against every map at no
more FLOPs; the claims made together at the end (the maps that beat the baseline, the front's confirmations)
are Benjamini-Hochberg adjusted, so that the share of false ones among them stays within the test's level.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import cast

from ilr_search.analysis.race_core import (
    DetectableGap,
    Evaluation,
    FrontPoint,
    RaceJob,
    RaceSettings,
    RaceState,
    Results,
    base_results,
    benjamini_hochberg,
    choose_contenders,
    loss_front,
    race_compute,
    race_lengths,
    reported_best,
)
from ilr_search.analysis.stats import PairedComparison, decision_level, paired_comparison


def fixed_race_state(evaluations: Sequence[Evaluation], settings: RaceSettings, baseline_key: str) -> RaceState:
    """The fixed policy's decision from every stored evaluation (see the module docstring).

    1. Every map with an evaluation (and the baseline) needs its base-length result at seeds[0]; until all
       have one, those are the only jobs (the contenders are chosen from them).
    2. Contenders: choose_contenders over the base results (a diverged base result is eliminated).
    3. Lengths race_lengths(settings) in order. At each, the maps entering it are raced seed by seed: a wave
       is every entering map's next missing seed (seeds in order), and after each wave the paired tests
       eliminate the maps a map at no more FLOPs beats (a run that diverges at a length is eliminated too).
       Once every survivor has all seeds at a length they are promoted to the next one (seeds before
       length, lengths in order, jobs listed best map first).
    4. Done when the survivors have every seed at the target, when the baseline alone survives (nothing left can
       change the verdict), or when the next wave would train beyond the compute cap `max_steps`.
    """
    lengths = race_lengths(settings)
    results, early, base_losses, eliminated = base_results(evaluations, settings, baseline_key)
    if early is not None:
        return early
    contenders = choose_contenders(base_losses, results.flops, baseline_key, settings.race_contenders)
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
            wave_seed = min(settings.seeds.index(m[0]) for m in missing.values() if m)
            seed = settings.seeds[wave_seed]
            jobs = [
                RaceJob(k, level, seed)
                for k in _rank(alive, results, lengths[: lengths.index(level) + 1])
                if seed in missing[k]
            ]
            break
    alive = _rank(alive, results, lengths[: lengths.index(level) + 1])
    compute = race_compute(evaluations, settings)
    cap = settings.max_steps
    stopped = ""
    if jobs and cap is not None and compute + sum(j.steps for j in jobs) > cap:
        jobs, stopped = [], f"the compute cap ({cap} steps) was reached"
    done = not jobs
    front, confirmed_better, verdict = _report(alive, results, settings, baseline_key, level, done, eliminated)
    if stopped:
        verdict += f"; stopped: {stopped}"
    gap = _fixed_detectable_gap(alive, results, settings, baseline_key, level)
    if gap is not None and not confirmed_better:
        verdict += (
            f"; gaps of {gap.ppl:.4f} ppl ({gap.nats:.4f} nats) or more would have been seen with "
            f"{round(100 * gap.power)}% power"
        )
    verdict += f"; the race trained {compute} steps"
    return RaceState(
        alive=tuple(alive),
        eliminated=eliminated,
        next_jobs=tuple(jobs),
        front=front,
        verdict=verdict,
        done=done,
        not_raced=not_raced,
        level_steps=level,
        confirmed_better=confirmed_better,
        best=reported_best(front, alive),
        compute_steps=compute,
        detectable_gap=gap,
        stopped=stopped,
    )


def _fixed_detectable_gap(
    alive: Sequence[str], results: Results, settings: RaceSettings, baseline_key: str, steps: int
) -> DetectableGap | None:
    """The gap the fixed race's test at `steps` would find with 80% power, from its closest contender's seeds and
    paired sd (a fixed-sample paired t test at the race's level)."""
    from ilr_search.analysis.sequential import detectable_gap

    base = results.at(baseline_key, steps)
    tests = [paired_comparison(results.at(k, steps), base, settings.confidence) for k in alive if k != baseline_key]
    usable = [c for c in tests if c.n >= 2 and c.sd_diff]
    if not usable or not base:
        return None
    c = min(usable, key=lambda c: (-c.n, c.mean_diff))
    assert c.sd_diff is not None  # usable: every one has a positive sd
    nats = detectable_gap(c.sd_diff, c.n, decision_level(settings.confidence))
    if nats is None:
        return None
    mean = results.mean(baseline_key, steps)
    return DetectableGap(
        nats,
        math.exp(mean) - math.exp(mean - nats),
        0.8,
        c.n,
        cast(float, c.sd_diff),
        decision_level(settings.confidence),
    )


def _describe(c: PairedComparison, winner: str, loser: str, steps: int) -> str:
    assert c.interval is not None
    return (
        f"{winner} better than {loser} at {steps} steps: loss difference {c.mean_diff:+.4f} "
        f"(interval {c.interval[0]:+.4f} to {c.interval[1]:+.4f}) over seeds "
        f"{','.join(map(str, c.seeds))}, one-sided paired t p={c.p_value:.3g} < {c.alpha:.3g}"
    )


def _eliminations(
    entering: Sequence[str], results: Results, steps: int, settings: RaceSettings, baseline_key: str
) -> dict[str, str]:
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


def _rank(keys: Sequence[str], results: Results, lengths: Sequence[int]) -> list[str]:
    """Best mean loss at the last of `lengths` first; maps with no result there by their mean at the length
    before, and so on; then by key."""

    return sorted(keys, key=lambda k: (tuple(results.mean(k, steps) for steps in reversed(lengths)), k))


def _front(alive: Sequence[str], results: Results, steps: int, confidence: float) -> tuple[FrontPoint, ...]:
    """The non-dominated alive maps at `steps` by (mean loss, flops), cheapest first; confirmed: a paired test
    shows it better than every cheaper front point, the p-values of all the front's tests adjusted together
    (Benjamini-Hochberg); the cheapest point is confirmed when it has >= 2 seeds."""
    front = loss_front(alive, results, steps, confidence)
    on_front = [p.map_key for p in front]
    pairs = [(k, c) for i, k in enumerate(on_front) for c in on_front[:i]]
    tests = [paired_comparison(results.at(k, steps), results.at(c, steps), confidence) for k, c in pairs]
    adjusted = dict(zip(pairs, benjamini_hochberg([t.p_value for t in tests]), strict=True))
    level = decision_level(confidence)
    shown = {pair: t.n >= 2 and adjusted[pair] < level for pair, t in zip(pairs, tests, strict=True)}
    return tuple(
        dataclasses.replace(p, confirmed=len(p.seeds) >= 2 and all(shown[(p.map_key, c)] for c in on_front[:i]))
        for i, p in enumerate(front)
    )


def _report(
    alive: Sequence[str],
    results: Results,
    settings: RaceSettings,
    baseline_key: str,
    steps: int,
    done: bool,
    eliminated: Mapping[str, str],
) -> tuple[tuple[FrontPoint, ...], tuple[str, ...], str]:
    """The front at the length reached, the maps confirmed better than the baseline there, and the verdict."""
    front = _front(alive, results, steps, settings.confidence)
    base = results.at(baseline_key, steps)
    prefix = "" if done else f"(race open at {steps} steps) "
    pct = round(settings.confidence * 100)
    if alive == [baseline_key] and not eliminated:
        return front, (), f"{prefix}no recurrent map was raced: the baseline {baseline_key} is the only contender"
    if alive == [baseline_key]:
        return (
            front,
            (),
            (
                f"{prefix}no recurrent map beats the baseline {baseline_key}: every contender was "
                f"eliminated by a paired test at {steps} steps or less ({pct}% confidence, "
                f"{len(eliminated)} eliminated)"
            ),
        )
    comparisons = {
        k: paired_comparison(results.at(k, steps), base, settings.confidence) for k in alive if k != baseline_key
    }
    keys = sorted(comparisons)
    adjusted = dict(zip(keys, benjamini_hochberg([comparisons[k].p_value for k in keys]), strict=True))
    better = tuple(
        sorted(
            (k for k in keys if comparisons[k].n >= 2 and adjusted[k] < decision_level(settings.confidence)),
            key=lambda k: (comparisons[k].mean_diff, k),
        )
    )
    base_ppl = math.exp(math.fsum(base.values()) / len(base)) if base else math.nan
    if better:
        parts = []
        for k in better:
            ppl = math.exp(results.mean(k, steps))
            c = comparisons[k]
            parts.append(
                f"{k} {ppl:.4f} ppl vs {base_ppl:.4f} ({ppl - base_ppl:+.4f} ppl, "
                f"{100 * (ppl / base_ppl - 1):+.2f}%, adjusted p={adjusted[k]:.3g} over {c.n} seeds)"
            )
        return (
            front,
            better,
            (
                f"{prefix}recurrence beats the baseline at {steps} steps ({pct}% paired t intervals, "
                f"Benjamini-Hochberg over {len(keys)} maps): " + "; ".join(parts)
            ),
        )
    n_seeds = len(base)
    text = (
        f"{prefix}nothing here is distinguishable from the baseline at {steps} steps with {n_seeds} seed"
        f"{'s' if n_seeds != 1 else ''} ({pct}% confidence)"
    )
    ranked = [k for k in alive if k != baseline_key and comparisons[k].n > 0]
    if not ranked:
        return front, (), text
    best = min(ranked, key=lambda k: (comparisons[k].mean_diff, k))
    c = comparisons[best]
    gap = math.exp(results.mean(best, steps)) - base_ppl
    need = c.seeds_needed()
    if c.sd_diff is None:
        text += f"; closest {best} ({gap:+.4f} ppl at one seed): a second seed would give a spread"
    elif need is None:
        text += (
            f"; closest {best} ({gap:+.4f} ppl, sd of the paired difference {c.sd_diff:.4f}): more than "
            f"1000 seeds would be needed to tell them apart"
        )
    else:
        who = f"{best} beats the baseline" if c.mean_diff < 0 else f"the baseline beats {best}"
        text += (
            f"; closest {best} ({gap:+.4f} ppl, sd of the paired loss difference {c.sd_diff:.4f}): if the gap "
            f"holds, {need} seeds at {steps} steps ({need * steps} steps per map) would show {who}"
        )
    return front, (), text
