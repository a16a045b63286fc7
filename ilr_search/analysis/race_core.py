"""The race's shared parts: what a policy reads (evaluations), asks for (jobs), is set by (RaceSettings) and says
(RaceState, its front points), and the steps every policy starts from (the base results, the contenders nearest
a front). The policies: fixed_race.py and adaptive_race.py; racing.py picks one."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ilr_search.analysis.pareto import non_dominated, non_dominated_ranks
from ilr_search.analysis.replicates import Judged, Replicates
from ilr_search.analysis.sequential import TestKind
from ilr_search.analysis.stats import seed_interval
from ilr_search.config import RacePolicy, SearchConfig, races
from ilr_search.records import record_json
from ilr_search.storage.store import Run


@dataclass(frozen=True)
class Evaluation:
    """One trained result: map `map_key` trained for `steps` steps at `seed`; val_loss None when it diverged. A
    frozen run's `scores`: one loss a unit (window or item) of its chunk, in unit order, paired by unit with every
    other map's run on that chunk (empty where not kept: trained runs, and the trials')."""

    map_key: str
    flops_ratio: float
    steps: int
    seed: int
    val_loss: float | None
    scores: tuple[float, ...] = ()


@dataclass(frozen=True)
class Measure:
    """How a race's loss differences are said: as perplexity at the baseline's (`ppl`: held-out text), as nats of
    answer loss (`answer`), or as accuracy points (`accuracy`: a loss of 0 or 1 an item, its mean the error rate)."""

    kind: Judged = "ppl"

    def gain(self, base_ppl: float, loss_diff: float) -> float:
        """What a map gains over the baseline (positive: better) from the mean paired loss difference (map minus
        baseline): ppl at the baseline's perplexity `base_ppl`, nats, or accuracy points."""
        if self.kind == "ppl":
            return base_ppl * (1.0 - math.exp(loss_diff))
        return -loss_diff * (100.0 if self.kind == "accuracy" else 1.0)

    def amount(self, value: float) -> str:
        """`0.12 ppl`, `0.012 nats of answer loss`, `3.1 accuracy points`."""
        if self.kind == "ppl":
            return f"{value:.2f} ppl" if abs(value) >= 0.01 or value == 0 else f"{value:.2g} ppl"
        if self.kind == "answer":
            return f"{value:.3f} nats of answer loss" if abs(value) >= 0.001 or value == 0 else f"{value:.2g} nats"
        return f"{value:.1f} accuracy points"

    def digits(self) -> int:
        """The digits an amount is rounded to (a gain that rounds to 0 is level)."""
        return {"ppl": 2, "answer": 3, "accuracy": 1}[self.kind]


@dataclass(frozen=True)
class RaceJob:
    """A result the race still needs: train `map_key` for `steps` steps at `seed`."""

    map_key: str
    steps: int
    seed: int


@dataclass(frozen=True)
class RaceSettings:
    """base_steps: the proxy's length (every map's first result); target_steps: the length the verdict is about.
    confidence: of the paired tests and the intervals (two-sided; a claim is the one-sided test at (1 - c) / 2).

    fixed: seeds are the seeds every contender is raced on, at each length doubled from base_steps up to the
    target; race_contenders: the maps raced beyond their base result.

    adaptive: seeds is the pool, in order (its length: the most seeds a comparison gets at the target); seeds[0]
    screens up to race_screen maps at the target, and race_contenders of them (the baseline among them) are then
    raced on seeds[1:], starting with race_seeds - 1 of them, look_every more a wave while a comparison is open
    (the sequential test looks there).
    max_steps caps the steps the race trains (None: no cap); futility: a contender stops once its paired t
    test says it is worse than the baseline at this one-sided level; calibration: screened maps before the base
    length may eliminate (and the screen's waves); min_agreement: the Spearman between base and target results
    of the screened maps that lets it; test: the sequential test (sequential.py); equal_compute: also train a
    deeper plain model of the best contender's compute at its seeds (the job's map key: deepR, R layers)."""

    base_steps: int
    target_steps: int
    seeds: tuple[int, ...] = (0, 1, 2)
    confidence: float = 0.9
    race_contenders: int = SearchConfig.race_contenders
    policy: RacePolicy = "adaptive"
    race_seeds: int = 3
    race_screen: int = 12
    max_steps: int | None = None
    futility: float = 0.3
    calibration: int = 5
    min_agreement: float = 0.8
    test: TestKind = "spending"
    lead_share: float = 0.8  # of the family's level, for the screen's best contender (adaptive_race.holm_weights)
    look_every: int = 0  # adaptive: seeds between the test's looks after its first; 0: automatic (looks_apart)
    equal_compute: bool = False
    layer_param_share: float = 0.0  # one layer's parameters over the plain model's (a deeper model's size); 0: unknown
    # frozen: maps applied to pretrained weights and only evaluated (base and target 0 steps); a seed s is chunk s
    # of the held-out windows or of the task items (training/frozen.py), and the race's words say so (Replicates)
    frozen: bool = False
    judged: Judged = "ppl"  # what the losses are (Measure); accuracy: 0/1 a unit, tested by the exact sign test
    items: bool = False  # frozen: the chunks hold task items (else held-out windows)
    # judge (`ilr-search judge`): each comparison is also tested the other way, and decided "worse" when the
    # baseline is claimed better (instead of the futility rule)
    two_sided: bool = False
    blocks: bool = False  # the study searches blocks only: a one-layer block is written block:I-I:R (Replicates.shown)
    # paired by unit: a claim needs the mean difference beyond this (nats of loss), so that a map equal to the
    # baseline but for float rounding is never claimed either way
    margin: float = 0.0

    @property
    def words(self) -> Replicates:
        return Replicates.of(self)

    @property
    def measure(self) -> Measure:
        return Measure(self.judged)

    @property
    def binary(self) -> bool:
        """Each unit's score is 0 or 1 (an item right or wrong)."""
        return self.judged == "accuracy"

    @property
    def races(self) -> bool:
        """Whether the race trains anything (config.races; the fixed race races on every seed of `seeds`)."""
        seeds = self.race_seeds if self.policy == "adaptive" else len(self.seeds)
        return races(self.base_steps, self.target_steps, seeds)


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


CANNOT_WIN = "cannot win"
COMPARISON_STATUSES = {  # a comparison's status -> what it means (docs/concepts.md's glossary says the same)
    "better": "claimed better than the baseline by the sequential paired test",
    CANNOT_WIN: "stopped by the futility rule: it trails the baseline so far that a later claim is unlikely "
    "(not a test that it is worse)",
    "dominated": "a contender of no more FLOPs beat it by a paired test",
    "worse": "claimed worse than the baseline by the sequential paired test run the other way (judge)",
    "diverged": "a run of it diverged at the target",
    "open": "still raced: more seeds to come",
    "undecided": "the pool's seeds are spent without a decision",
    "capped": "the compute cap stopped it before a decision",
}
DECIDED_AGAINST = (CANNOT_WIN, "dominated", "diverged", "worse")  # statuses that end a comparison without a claim


@dataclass(frozen=True)
class Comparison:
    """A contender against the baseline at the target, over their common test seeds (seeds[1:], in pool order).
    mean_diff: mean of loss_map - loss_baseline (negative: the map is better); interval: its two-sided t interval
    at the race's confidence; p_value: the one-sided paired t test's, nominal (as if the seeds had been fixed);
    level: the one-sided level the sequential test holds it to (its share of the family's, Holm); boundary: the t
    the test needs at its last look; status: one of COMPARISON_STATUSES."""

    map_key: str
    flops_ratio: float
    seeds: tuple[int, ...]
    mean_diff: float | None
    sd_diff: float | None
    interval: tuple[float, float] | None
    p_value: float
    t: float | None
    level: float
    boundary: float | None
    status: str
    decided_at: int | None = None  # test seeds at the claim
    why: str = ""
    units: int = 0  # a frozen comparison paired by unit: the windows or items over its chunks (0: by seed)
    # paired by unit: the smallest gap (in the loss's unit) its test at its chunks finds with 80% power
    detectable: float | None = None

    @property
    def n(self) -> int:
        return len(self.seeds)

    def to_dict(self) -> dict[str, Any]:
        return record_json(
            self,
            names={"map_key": "map"},
            boundary=self.boundary if self.boundary is None or math.isfinite(self.boundary) else None,
        )


def race_result(run: Run) -> Run:
    """A finished run (Run.finished) as the race reads it: its losses, perplexity, bits per byte and per-unit
    scores where it is complete, none where it diverged (val_loss None)."""
    if run.state == "complete" and run.val_loss is not None:
        return run
    return replace(run, val_loss=None, val_ppl=None, val_bpb=None, scores=())


def run_evaluation(result: Run) -> Evaluation:
    """The evaluation a policy reads of a stored result (race_result)."""
    return Evaluation(result.map_key, result.flops_ratio, result.steps, result.seed, result.val_loss, result.scores)


def result_dict(result: Run, schedule: str) -> dict[str, Any]:
    """A stored result's (race_result) JSON form, trained under the learning-rate `schedule`, without its per-unit
    scores (the race's tests read them; `export` writes them): `source` names the trial at the proxy's length, the
    reference run or the race run (the race's or the audit's) it comes from by its number, name or factor."""
    source = {
        "trial": f"trial {result.trial}",
        "reference": f"reference {result.name}",
        "race": f"run {result.factor}x",
    }[result.kind]
    return {
        "map_key": result.map_key,
        "flops_ratio": result.flops_ratio,
        "steps": result.steps,
        "seed": result.seed,
        "schedule": schedule,
        "val_loss": result.val_loss,
        "val_ppl": result.val_ppl,
        "val_bpb": result.val_bpb,
        "source": source,
    }


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
    compute_steps: int = 0  # steps of the results the race trained beyond the base results (every length > base)
    # adaptive only: each raced comparison with the baseline at the target,
    # the screen (maps, their base and target results, the lengths' agreement), the deeper plain model of the same
    # compute, the smallest gap the race would find at 80% power, and why it stopped
    comparisons: tuple[Comparison, ...] = ()
    screen: Screen | None = None
    equal_compute: EqualCompute | None = None
    detectable_gap: DetectableGap | None = None
    stopped: str = ""


@dataclass(frozen=True)
class ScreenAgreement:
    """How the base length ranks the screened maps against the target: the Spearman over `maps` maps (None where
    it cannot be computed), and `margin`, the largest base lead the target overturned."""

    maps: int
    spearman: float | None
    margin: float

    def to_dict(self) -> dict[str, Any]:
        return record_json(self)


@dataclass(frozen=True)
class Screen:
    """The adaptive race's screen: the candidate maps, those screened at the target (at the first seed), the two
    lengths' agreement over them, each candidate's base loss and each screened map's target loss, and the maps
    the compute cap left unscreened (None where it did not)."""

    maps: tuple[str, ...]
    screened: tuple[str, ...]
    agreement: ScreenAgreement
    base_losses: Mapping[str, float]
    target_losses: Mapping[str, float]
    capped: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return record_json(self, omit=() if self.capped is not None else ("capped",))


@dataclass(frozen=True)
class DetectableGap:
    """The smallest gap the race's test would have found with `power` (in the loss's unit, `nats`: nats, or for
    accuracy a share of items; and in perplexity below the baseline's, `ppl`, where perplexity is judged), at
    `seeds` test seeds (chunks) with the paired sd `sd_diff` (of the seeds, or of the `units` paired within them),
    at the test's `level`. `amount`: the gap as the answer says it (Measure.gain)."""

    nats: float
    ppl: float
    power: float
    seeds: int
    sd_diff: float
    level: float
    units: int = 0  # units (windows or items) the differences were paired by; 0: paired by seed or chunk
    judged: Judged = "ppl"

    @property
    def amount(self) -> float:
        """The gap in the measure's unit: ppl, nats of answer loss, or accuracy points."""
        return self.ppl if self.judged == "ppl" else Measure(self.judged).gain(0.0, -self.nats)

    def text(self) -> str:
        """`a gap of 0.14 ppl` (or `... nats of answer loss`, `... accuracy points`)."""
        return f"a gap of {Measure(self.judged).amount(self.amount)}"

    def to_dict(self) -> dict[str, Any]:
        return record_json(self) | {"amount": self.amount}


@dataclass(frozen=True)
class DeepDiff:
    """The race's best map against the plain model of its compute, paired by seed: the mean loss difference (best
    map minus the plain model; negative: the map is better), its sd and interval, the one-sided p, the plain model's
    perplexity over the paired seeds (`deep_ppl`), and the mean difference as perplexity there (`ppl_diff`, the map
    minus the plain model, as the answer says it)."""

    seeds: tuple[int, ...]
    mean_diff: float
    sd_diff: float | None
    interval: tuple[float, float] | None
    p_value: float
    deep_ppl: float
    ppl_diff: float

    def to_dict(self) -> dict[str, Any]:
        return record_json(self, names={"deep_ppl": "reference_ppl"})


@dataclass(frozen=True)
class EqualCompute:
    """The race's equal-compute comparison: `deep_key` (deepR: the study's model with `layers` layers, each run once,
    of about the FLOPs of the best map `map`), its FLOP ratio, its parameters against the baseline's
    (`params_ratio`; `params` and `baseline_params` where search/race.py counted them), the length and seeds it
    trained at, its mean perplexity and interval there (where it has a seed), and the best map against it
    (`map_minus_deep`, where they share a seed). to_dict is its JSON form (`reference` is the deep model's key,
    `map_minus_reference` the paired difference)."""

    deep_key: str
    layers: int
    map: str
    flops_ratio: float | None
    params_ratio: float | None
    steps: int
    seeds: tuple[int, ...]
    val_ppl: float | None = None
    interval: tuple[float, float] | None = None
    map_minus_deep: DeepDiff | None = None
    params: int | None = None
    baseline_params: int | None = None

    def to_dict(self) -> dict[str, Any]:
        omit: tuple[str, ...] = () if self.seeds else ("val_ppl", "interval")  # no seed trained: no mean yet
        omit += () if self.map_minus_deep is not None else ("map_minus_deep",)
        omit += () if self.params is not None else ("params", "baseline_params")
        return record_json(self, names={"deep_key": "reference", "map_minus_deep": "map_minus_reference"}, omit=omit)


def race_lengths(settings: RaceSettings) -> tuple[int, ...]:
    """base, 2 base, 4 base, ... below the target, then the target itself."""
    if settings.base_steps < 1 or settings.target_steps < settings.base_steps:
        raise ValueError(
            f"the target ({settings.target_steps} steps) must be at least the base length ({settings.base_steps} steps)"
        )
    lengths = []
    steps = settings.base_steps
    while steps < settings.target_steps:
        lengths.append(steps)
        steps *= 2
    return tuple(lengths) + (settings.target_steps,)


@dataclass(frozen=True)
class Results:
    """The evaluations by map: flops, {steps: {seed: val_loss}} (None where the run diverged), and the frozen
    runs' per-unit scores {steps: {seed: scores}} where kept."""

    flops: dict[str, float]
    losses: dict[str, dict[int, dict[int, float | None]]]
    scores: dict[str, dict[int, dict[int, tuple[float, ...]]]] = field(default_factory=dict)

    def units(self, key: str, steps: int, seed: int) -> tuple[float, ...]:
        """A map's per-unit scores on one chunk (empty where not kept)."""
        return self.scores.get(key, {}).get(steps, {}).get(seed, ())

    def mean(self, key: str, steps: int) -> float:
        """A map's mean loss over its seeds at `steps`; inf where it has none."""
        losses = self.at(key, steps)
        return math.fsum(losses.values()) / len(losses) if losses else math.inf

    def at(self, key: str, steps: int) -> dict[int, float]:
        """A map's finite losses at one length, by seed."""
        return {s: v for s, v in self.losses.get(key, {}).get(steps, {}).items() if v is not None and math.isfinite(v)}

    def diverged_at(self, key: str, steps: int) -> list[int]:
        return sorted(
            s for s, v in self.losses.get(key, {}).get(steps, {}).items() if v is None or not math.isfinite(v)
        )


def collect(evaluations: Sequence[Evaluation]) -> Results:
    flops: dict[str, float] = {}
    losses: dict[str, dict[int, dict[int, float | None]]] = {}
    scores: dict[str, dict[int, dict[int, tuple[float, ...]]]] = {}
    for e in evaluations:
        flops[e.map_key] = e.flops_ratio
        losses.setdefault(e.map_key, {}).setdefault(e.steps, {})[e.seed] = e.val_loss
        if e.scores:
            scores.setdefault(e.map_key, {}).setdefault(e.steps, {})[e.seed] = e.scores
    return Results(flops, losses, scores)


def by_seed(losses: Mapping[int, float]) -> list[float]:
    """A map's losses in seed order (sums in a fixed order: the same decision whatever order results came in)."""
    return [losses[s] for s in sorted(losses)]


def loss_front(
    alive: Sequence[str], results: Results, steps: int, confidence: float, confirmed: Collection[str] = ()
) -> list[FrontPoint]:
    """The non-dominated maps of `alive` at `steps` by (mean loss, FLOPs), cheapest first, each with the t interval of
    its seeds' losses (by_seed); confirmed: those in `confirmed` (each race confirms its points its own way)."""
    keys = [k for k in alive if results.at(k, steps)]
    intervals = {k: seed_interval(by_seed(results.at(k, steps)), confidence) for k in keys}
    idx = non_dominated([(intervals[k].mean_loss, results.flops[k]) for k in keys])
    on_front = sorted((keys[i] for i in idx), key=lambda k: (results.flops[k], intervals[k].mean_loss, k))
    return [
        FrontPoint(
            map_key=k,
            flops_ratio=results.flops[k],
            steps=steps,
            seeds=tuple(sorted(results.at(k, steps))),
            val_ppl=intervals[k].val_ppl,
            interval=intervals[k].interval_ppl or (0.0, math.inf),
            confirmed=k in confirmed,
        )
        for k in on_front
    ]


def choose_contenders(
    base_losses: Mapping[str, float], flops: Mapping[str, float], baseline_key: str, most: int
) -> list[str]:
    """The maps nearest the base front: by non-dominated rank in (loss, flops) at the base length and first
    seed, then by loss, then by key (reproducible); at most `most` (the screen's or the contenders' count), the
    baseline always among them."""
    keys = sorted(base_losses)
    ranks = non_dominated_ranks([(base_losses[k], flops[k]) for k in keys])
    order = sorted(range(len(keys)), key=lambda i: (ranks[i], base_losses[keys[i]], keys[i]))
    chosen = [keys[i] for i in order if keys[i] != baseline_key][: max(0, most - 1)]
    return [baseline_key] + chosen if baseline_key in base_losses else chosen


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (scipy.stats.false_discovery_control): a family of claims made at
    once ("these maps beat the baseline") keeps its expected share of false ones below the decision level."""
    if not p_values:
        return []
    from scipy.stats import false_discovery_control

    return [float(p) for p in false_discovery_control(list(p_values))]


def base_results(
    evaluations: Sequence[Evaluation], settings: RaceSettings, baseline_key: str
) -> tuple[Results, RaceState | None, dict[str, float], dict[str, str]]:
    """Every evaluation by map, and the base results every policy starts from: each known map (and the baseline)
    at the base length and seeds[0]. Returns (results, a state to return now or None, the finite base losses,
    the maps eliminated for a diverged base result): the state asks for missing base results first, or ends the
    race when the baseline diverged."""
    if not settings.seeds:
        raise ValueError("the race needs at least one seed")
    results = collect(evaluations)
    base, first_seed, words = settings.base_steps, settings.seeds[0], settings.words
    known = sorted(set(results.losses) | {baseline_key})
    missing_base = [k for k in known if first_seed not in results.losses.get(k, {}).get(base, {})]
    if missing_base:
        return (
            results,
            RaceState(
                alive=(),
                next_jobs=tuple(RaceJob(k, base, first_seed) for k in missing_base),
                level_steps=base,
                verdict=f"waiting for the base results ({words.at(base)}, "
                f"{words.one(first_seed)}) of {len(missing_base)} map(s)",
            ),
            {},
            {},
        )
    eliminated: dict[str, str] = {}
    base_losses: dict[str, float] = {}
    for k in known:
        loss = results.losses[k][base][first_seed]
        if loss is None or not math.isfinite(loss):
            eliminated[k] = f"diverged {words.at(base)}, {words.one(first_seed)}"
        else:
            base_losses[k] = loss
    if baseline_key not in base_losses:
        return (
            results,
            RaceState(
                alive=(),
                eliminated=eliminated,
                level_steps=base,
                done=True,
                verdict=f"the baseline {baseline_key} diverged {words.at(base)}: nothing to race against",
            ),
            base_losses,
            eliminated,
        )
    return results, None, base_losses, eliminated


def race_compute(evaluations: Sequence[Evaluation], settings: RaceSettings) -> int:
    """The steps the race trains: every result longer than the base length, and for the fixed policy the base
    length's other seeds too (the base results at seeds[0] are the trials')."""
    return sum(
        e.steps
        for e in evaluations
        if e.steps > settings.base_steps or (settings.policy == "fixed" and e.seed != settings.seeds[0])
    )


def reported_best(front: Sequence[FrontPoint], alive: Sequence[str]) -> str | None:
    """The best map the evidence supports: the lowest-perplexity confirmed front point (better than every cheaper
    point by the paired tests), so that a map whose lead is within the noise is not reported over a cheaper one
    it has not beaten; with no confirmed point, the best mean among the survivors."""
    confirmed = [p for p in front if p.confirmed]
    if confirmed:
        return min(confirmed, key=lambda p: (p.val_ppl, p.map_key)).map_key
    return alive[0] if alive else None
