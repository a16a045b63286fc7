"""The study's answer in one line, then its details as a short list: what a researcher reads first.

The line begins `use MAP` (a map the race claimed better than the plain model), `no map beat` (nothing was), or
`no decision yet` (the race is open). It is built from the race's state alone (race_core.RaceState, its
comparisons and front), in the words of its replicates (analysis/replicates.py: "seed" and "at 2000 steps"; a
frozen study's "window chunk" and "on held-out windows"), so every wording is made from data here and nowhere
else. Differences are said in words (`better by` / `worse by`), never by a bare sign.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ilr_search.analysis.fidelity import AGREE_SPEARMAN, PARTLY_SPEARMAN
from ilr_search.analysis.race_core import Comparison, EqualCompute, FrontPoint, Measure, RaceSettings, RaceState
from ilr_search.analysis.replicates import Replicates

PLAIN = "the plain model"  # the all-ones map: every layer run once, no recurrence
PPL = Measure("ppl")
# how far the proxy's order is trusted: the least Spearman of each wording, highest first (below: "unlike", "a weak")
TRUST_WORDS = ((AGREE_SPEARMAN, "like", "a good"), (PARTLY_SPEARMAN, "only partly like", "a rough"))


@dataclass(frozen=True)
class Trust:
    """How far the proxy's order can be trusted: the Spearman between the proxy's and the target's results over
    `maps` maps (the race's screen, or an audit), with the two lengths."""

    spearman: float
    maps: int
    proxy_steps: int
    target_steps: int

    def text(self) -> str:
        words = (words for floor, *words in TRUST_WORDS if self.spearman >= floor)
        how, guide = next(words, ("unlike", "a weak"))
        return (
            f"the {self.proxy_steps}-step search ranked maps {how} {self.target_steps}-step training (Spearman "
            f"{self.spearman:.2f} over {self.maps} maps): its order is {guide} guide"
        )


@dataclass(frozen=True)
class Answer:
    """The one line (`use MAP ...`, `no map beat ...` or `no decision yet: ...`), whether it is a decision, the
    details under it (closest contender, equal compute, replicates, steps, why the race stopped), and the trust
    signal shown beside the verdict (None where no proxy-to-target agreement was measured)."""

    line: str
    details: tuple[str, ...] = ()
    decided: bool = True
    trust: Trust | None = None

    @property
    def claims(self) -> bool:
        return self.line.startswith("use ")


def count(n: int, unit: str) -> str:
    """`1 seed`, `6 seeds` (unit: the replicate's name in the singular)."""
    return f"{n} {unit}{'' if n == 1 else 's'}"


def side(gain: float, other: str, measure: Measure = PPL) -> str:
    """A difference against `other` in words: a positive `gain` (lower ppl, lower answer loss, higher accuracy) is
    `better by X ppl than other`, a negative one `worse by X ppl than other`, one that rounds to 0 `level with
    other` (X in the measure's unit: ppl, nats of answer loss, accuracy points)."""
    if round(abs(gain), measure.digits()) == 0:
        return f"level with {other}"
    return f"{'better' if gain > 0 else 'worse'} by {measure.amount(abs(gain))} than {other}"


def interval_words(base_ppl: float, interval: Sequence[float] | None, confidence: float, measure: Measure = PPL) -> str:
    """`90% interval 0.03 to 0.13` (both better), or `90% interval from 0.05 worse to 0.01 better`."""
    if not interval or None in interval:
        return ""
    # the loss's high end is the least gain
    low, high = measure.gain(base_ppl, interval[1]), measure.gain(base_ppl, interval[0])
    pct, d = round(confidence * 100), measure.digits()
    low, high = low + 0.0, high + 0.0  # no "-0.0"
    if low > 0:
        return f"{pct}% interval {low:.{d}f} to {high:.{d}f}"
    if high < 0:
        return f"{pct}% interval {abs(high):.{d}f} to {abs(low):.{d}f} worse"
    return f"{pct}% interval from {abs(low):.{d}f} worse to {high:.{d}f} better"


def _map(key: str) -> str:
    return key.replace("|", " with ")


def _named(settings: RaceSettings | None, key: str) -> str:
    """A map as the answer names it: as its study shows it (Replicates.shown), its knobs `with` them."""
    return _map(Replicates.of(settings).shown(key))


def _bracketed(text: str, open_: str = " (", close: str = ")") -> str:
    return f"{open_}{text}{close}" if text else ""


def _point(front: Sequence[FrontPoint], key: str) -> FrontPoint | None:
    return next((p for p in front if p.map_key == key), None)


def race_answer(
    state: RaceState, settings: RaceSettings, baseline_key: str, baseline_ppl: float | None, trust: Trust | None = None
) -> Answer:
    """The answer of a race (see the module docstring). `baseline_ppl`: the plain model's mean perplexity at
    the race's length (None before it has one)."""
    words = Replicates.of(settings)
    steps = state.level_steps or settings.target_steps
    at = words.at(steps)  # "at 2000 steps", or a frozen study's "on held-out windows"
    comparisons = {c.map_key: c for c in state.comparisons}
    details: list[str] = []
    claimed = state.best if state.done and state.best in state.confirmed_better else None
    if not state.done:
        open_maps = [k for k, c in comparisons.items() if c.status == "open"]
        left = (
            f"{len(open_maps)} of {len(comparisons)} comparisons with {PLAIN} still open"
            if comparisons
            else f"{count(len(state.alive), 'map')} still raced"
            if state.alive
            else "the race has not started"
        )
        line = (
            f"no decision yet: {left} {at}, {count(len(state.next_jobs), 'run')} to train next; "
            "run the same command again to go on"
        )
    elif claimed is not None:
        line = _claim(state, settings, claimed, comparisons.get(claimed), baseline_key, baseline_ppl, at)
    else:
        gap = state.detectable_gap
        seen = (
            f"{gap.text()} or more would have been seen ({round(100 * gap.power)}% power)"
            if gap
            else f"too few {words.plural} to say what gap would have been seen"
        )
        if not comparisons and state.front and all(p.map_key == baseline_key for p in state.front):
            seen = "no recurrent map reached the race"
        line = f"no map beat {PLAIN} {at}; {seen}"
    if baseline_ppl is not None:
        details += _closest(comparisons, claimed, baseline_ppl, settings)
    details += _equal_compute(state.equal_compute, settings)
    details += _replicates(state, comparisons, baseline_key, settings)
    details.append(
        f"steps: {steps} a run at the target (the search's proxy trained {settings.base_steps}); the "
        f"race trained {state.compute_steps} in all"
        if words.trains
        else f"frozen: no step trained; every result is the pretrained weights evaluated on a chunk of "
        f"{words.chunk_of}, the race's comparisons paired by {words.paired}"
    )
    if state.done and state.stopped:
        details.append(f"stopped because {state.stopped}")
    return Answer(line, tuple(details), state.done, trust)


def _claim(
    state: RaceState,
    settings: RaceSettings,
    key: str,
    comparison: Comparison | None,
    baseline_key: str,
    baseline_ppl: float | None,
    at: str,
) -> str:
    """The line of a claim: `use MAP: X better than the plain model (90% interval ...), N seeds at 2000 steps`."""
    point, base = _point(state.front, key), _point(state.front, baseline_key)
    n = len(point.seeds) if point is not None else comparison.n if comparison else 0
    measure = settings.measure
    if comparison is not None and comparison.mean_diff is not None and baseline_ppl is not None:
        gain = measure.gain(baseline_ppl, comparison.mean_diff)
        interval = interval_words(baseline_ppl, comparison.interval, settings.confidence, measure)
    elif point is not None and base is not None and measure.kind == "ppl":
        gain, interval = base.val_ppl - point.val_ppl, ""
    else:
        gain, interval = math.nan, ""
    how = (
        f"{measure.amount(abs(gain))} {'better' if gain >= 0 else 'worse'} than {PLAIN}"
        if math.isfinite(gain)
        else f"better than {PLAIN}"
    )
    return f"use {_named(settings, key)}: {how}{_bracketed(interval)}, {settings.words.count(n)} {at}"


def _closest(
    comparisons: Mapping[str, Comparison], answered: str | None, baseline_ppl: float, settings: RaceSettings
) -> list[str]:
    rest = [(d, c) for k, c in comparisons.items() if k != answered and (d := c.mean_diff) is not None]
    if not rest:
        return []
    measure = settings.measure
    diff, c = min(rest, key=lambda p: (p[0], p[1].map_key))
    interval = interval_words(baseline_ppl, c.interval, settings.confidence, measure)
    paired = f", {c.units} paired" if c.units else ""
    return [
        f"closest contender: {_named(settings, c.map_key)} {side(measure.gain(baseline_ppl, diff), PLAIN, measure)}"
        f"{_bracketed(interval)} over {settings.words.count(c.n, test=True)}{paired}; status: {c.status}"
    ]


def _equal_compute(equal: EqualCompute | None, settings: RaceSettings) -> list[str]:
    if equal is None or equal.map_minus_deep is None:
        return []
    d = equal.map_minus_deep
    params = f", {equal.params_ratio:.2f}x the parameters" if equal.params_ratio else ""
    interval = _bracketed(interval_words(d.deep_ppl, d.interval, settings.confidence), "; ", "")
    return [
        f"equal compute: {_map(equal.map)} {side(-d.ppl_diff, f'a plain {equal.layers}-layer model')} "
        f"of the same compute ({equal.deep_key}{params}{interval}) over {settings.words.count(len(d.seeds))}"
    ]


def _replicates(
    state: RaceState, comparisons: Mapping[str, Comparison], baseline_key: str, settings: RaceSettings
) -> list[str]:
    """Each front map's replicates at the race's length ("at 2000 steps"), as the front and the race tables count
    them (the screening one included), with the test ones the comparison used."""
    words, parts = settings.words, []
    for p in state.front:
        name = PLAIN if p.map_key == baseline_key else _named(settings, p.map_key)
        c = comparisons.get(p.map_key)
        tested = f" ({c.n} of them tested against {PLAIN})" if c is not None else ""
        parts.append(f"{name} {words.count(len(p.seeds))}{tested}")
    return [f"{words.plural} {words.at(state.level_steps)}: " + "; ".join(parts)] if parts else []


def unraced_answer(why: str, steps: int) -> Answer:
    """The answer of a study whose race trained nothing (`why`: the race is off, or the study was not made by
    ilr-search): no map was shown better than the plain model by a test."""
    return Answer(f"no map beat {PLAIN} by a test at {steps} steps: {why}", (), True)


def judge_answer(state: RaceState, settings: RaceSettings, model: str, baseline_ppl: float | None) -> Answer:
    """The answer of `ilr-search judge`: a line a candidate, the best first. `C is better than MODEL by X (90%
    interval ...)` or `C is worse than MODEL by X (...)` where the sequential test claimed it one way or the other,
    else `C is not distinguishable from MODEL: a gap of X or more would have been seen (80% power)`; while the race
    is open, `no decision yet`."""
    measure, words, pct = settings.measure, Replicates.of(settings), round(settings.confidence * 100)
    base = baseline_ppl if baseline_ppl is not None else math.nan
    comparisons = sorted(state.comparisons, key=lambda c: (math.inf if c.mean_diff is None else c.mean_diff, c.map_key))
    lines = []
    for c in comparisons:
        interval = interval_words(base, c.interval, settings.confidence, measure)
        over = words.count(c.n, test=True) + (f", {c.units} {words.paired}s paired" if c.units else "")
        gain = measure.gain(base, c.mean_diff) if c.mean_diff is not None else math.nan
        if c.status in ("better", "worse"):
            lines.append(
                f"{_named(settings, c.map_key)} is {c.status} than {model} by {measure.amount(abs(gain))}"
                f"{_bracketed(interval)}, {over} {words.at(state.level_steps)}"
            )
            continue
        gap = c.detectable
        seen = (
            f"a gap of {measure.amount(measure.gain(base, -gap))} or more would have been seen (80% power)"
            if gap is not None
            else f"too few {words.plural} to say what gap would have been seen"
        )
        measured = f"; measured {side(gain, model, measure)}" if math.isfinite(gain) else ""
        lines.append(
            f"{_named(settings, c.map_key)} is not distinguishable from {model}: {seen}{measured}"
            f"{_bracketed(interval)}, {over}"
        )
    if not lines:
        lines.append(f"no candidate other than {model} itself was judged")
    if not state.done:
        open_maps = sum(c.status == "open" for c in comparisons)
        line = (
            f"no decision yet: {open_maps} of {len(comparisons)} candidates still open {words.at(state.level_steps)}, "
            f"{count(len(state.next_jobs), 'run')} to evaluate next; run the same command again to go on"
        )
        return Answer(line, tuple(lines), False)
    details = [
        *lines[1:],
        f"{pct}% intervals; each candidate tested both ways by a sequential test paired by {words.paired}, "
        f"at its share of the family's level (Holm), on {words.plural} 1 and after (chunk 0 ordered the candidates)",
    ]
    if state.stopped:
        details.append(f"stopped because {state.stopped}")
    return Answer(lines[0], tuple(details), True)


def out_of_time_answer(
    answer: Answer, budget: str, before_race: str, state: RaceState | None, settings: RaceSettings | None
) -> Answer:
    """The answer of a run its time budget (`budget`, in words: `15m`) stopped before the study decided, the race's
    own numbers said as they stand: `no decision yet: the time budget (15m) ran out; undecided after 3 test seeds at
    2000 steps (2 of 2 comparisons with the plain model still open); a gap of 0.14 ppl or more would have been seen
    by now (80% power); the same command continues`. `before_race`: how far the trials and reference runs got where
    the budget ran out before the race (`after 3 of 8 trials`), else empty. The answer's details follow, after a
    line that says what the budget stopped."""
    parts = [f"no decision yet: the time budget ({budget}) ran out" + (f" {before_race}" if before_race else "")]
    if before_race or state is None or settings is None:
        parts.append("the race has not started")
    else:
        words = Replicates.of(settings)
        at = words.at(state.level_steps or settings.target_steps)
        tested = [c for c in state.comparisons if c.n]
        gap = state.detectable_gap
        if not tested:
            parts.append(
                f"the race has not reached its tests yet ({count(len(state.next_jobs), 'run')} to train next {at})"
            )
        else:
            n = gap.seeds if gap is not None else max(c.n for c in tested)
            open_ = sum(c.status == "open" for c in state.comparisons)
            parts.append(
                f"undecided after {words.count(n, test=True)} {at} ({open_} of {len(state.comparisons)} "
                f"comparisons with {PLAIN} still open)"
                if open_
                else f"every comparison with {PLAIN} decided after {words.count(n, test=True)} {at}, the "
                "equal-compute reference not yet"
            )
            parts.append(
                f"{gap.text()} or more would have been seen by now ({round(100 * gap.power)}% power)"
                if gap is not None
                else f"too few test {words.plural} yet to say what gap would have been seen"
            )
    parts.append("the same command continues")
    stopped = (
        f"time budget {budget}: spent; no new run started after it and the runs in flight finished; the same "
        "command (with another budget or none) goes on from here, training nothing twice"
    )
    return Answer("; ".join(parts), (stopped, *answer.details), False, answer.trust)
