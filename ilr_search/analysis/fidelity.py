"""How far a study's proxy can be trusted, measured from the study itself.

- Rung agreement: for each early evaluation step (rung), the rank agreement between the loss there and the
  final loss of the study's complete, unpruned maps. In this domain it can be negative: recurrent maps start
  slower and overtake later.
- Noise: the all-ones baseline at extra seeds, and a second seed of the best recurrent map.
- The audit (`ilr-search audit`): chosen maps retrained `factor` times longer; the agreement between proxy and
  audit perplexity, the audited front against the proxy front, and any pruned map that reaches it.
Everything here is computed from trials and stored rows; nothing trains.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, cast

from optuna.trial import TrialState

from ilr_search.analysis.pareto import non_dominated
from ilr_search.analysis.results import (
    Curves,
    FrontRow,
    as_list,
    is_baseline,
    study_front,
    trained_by_map,
    trained_trials,
)
from ilr_search.analysis.stats import groups_differ, paired_comparison, rank_agreement
from ilr_search.knobs import KnobValue
from ilr_search.records import record_json
from ilr_search.storage import Run
from ilr_search.storage.trials import TrialRecord, trained_results
from ilr_search.training.schedule import Map, format_reuse_map, is_all_ones_key, is_baseline_key, map_text

AGREE_SPEARMAN = 0.8  # "the proxy ranks as longer training does"
PARTLY_SPEARMAN = 0.5


@dataclass(frozen=True)
class RungAgreement:
    step: int
    fraction: float  # of the proxy's steps
    n_maps: int
    spearman: float | None
    kendall: float | None


def rung_agreements(curves: Mapping[str, Mapping[int, float]], final_step: int) -> list[RungAgreement]:
    """Per rung, Spearman and Kendall between the loss there and the final loss, over the maps whose curve
    reached `final_step` (`curves`: map -> {step: val_loss})."""
    complete = {k: c for k, c in curves.items() if final_step in c}
    rungs = sorted({s for c in complete.values() for s in c if s < final_step})
    out = []
    for step in rungs:
        keys = [k for k, c in complete.items() if step in c]
        rho, tau = rank_agreement([complete[k][step] for k in keys], [complete[k][final_step] for k in keys])
        out.append(RungAgreement(step, step / final_step, len(keys), rho, tau))
    return out


def map_curves(trials: Sequence[TrialRecord], curves: Curves) -> dict[str, dict[int, float]]:
    """map -> {step: val_loss} of the complete trials that trained their map."""
    return {
        r.map_key: dict(curves.get(r.number, {}))
        for r in trained_trials(trials)
        if r.state == TrialState.COMPLETE and r.map_key is not None  # a trained trial has its key
    }


@dataclass(frozen=True)
class NoiseBand:
    """The baseline's seed-to-seed spread of perplexity at the proxy's length (noise_band)."""

    val_ppls: tuple[float, ...]

    @property
    def n_seeds(self) -> int:
        return len(self.val_ppls)

    @property
    def min_ppl(self) -> float:
        return min(self.val_ppls)

    @property
    def max_ppl(self) -> float:
        return max(self.val_ppls)

    @property
    def spread(self) -> float:
        return self.max_ppl - self.min_ppl

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_seeds": self.n_seeds,
            "val_ppls": list(self.val_ppls),
            "min_ppl": self.min_ppl,
            "max_ppl": self.max_ppl,
            "spread": self.spread,
        }


def noise_band(trials: Sequence[TrialRecord], references: Mapping[str, Run]) -> NoiseBand | None:
    """Seed-to-seed spread of the baseline's perplexity: the trial of the all-ones map (the study's seed) and the
    baseline references trained at extra seeds (of `references`, the study's by name: stored_references)."""
    ppls: list[float] = [
        r.val_ppl
        for r in trained_results(trials)
        if r.val_ppl is not None and r.map_key is not None and is_baseline_key(r.map_key)  # trained: both set
    ][:1]
    ppls += [
        ref.val_ppl
        for name, ref in sorted(references.items())
        if name.startswith("baseline_seed") and ref.val_ppl is not None
    ]
    return NoiseBand(tuple(ppls)) if len(ppls) >= 2 else None


def mark_ties(front: Sequence[FrontRow], noise: NoiseBand | None) -> list[FrontRow]:
    """The front's points, each with `within_noise_of`: the other front points whose perplexity is within the
    noise."""
    spread = noise.spread if noise else 0.0
    return [
        dataclasses.replace(
            p, within_noise_of=tuple(q.trial for q in front if q is not p and abs(q.val_ppl - p.val_ppl) <= spread)
        )
        for p in front
    ]


@dataclass(frozen=True)
class BestRecurrent:
    """The best non-baseline map of the proxy trials (best_recurrent), and whether it is on the proxy's front."""

    trial: int
    reuse_map: tuple[int, ...] | None
    map: str
    val_ppl: float
    flops_ratio: float
    knobs: Mapping[str, KnobValue]
    on_front: bool

    def to_dict(self) -> dict[str, Any]:
        return record_json(self)


def best_recurrent(trials: Sequence[TrialRecord]) -> BestRecurrent | None:
    """The best non-baseline map: on the front if the front has one, else the best complete one."""
    candidates = [r for r in trained_results(trials) if not is_baseline(as_list(r.reuse_map))]
    if not candidates:
        return None
    front = {p.trial for p in study_front(trials)}
    on_front = [r for r in candidates if r.number in front]
    best = min(on_front or candidates, key=lambda r: cast(float, r.val_ppl))  # a trained result has its perplexity
    return BestRecurrent(
        best.number,
        best.reuse_map,
        map_text(best.map_key or ""),
        cast(float, best.val_ppl),
        cast(float, best.flops_ratio),
        dict(best.knobs),
        bool(on_front),
    )


@dataclass(frozen=True)
class SecondSeed:
    """The best recurrent map at a second seed (the `second_seed` reference run): its perplexity at the study's seed
    and at the reference's (None where that run has none)."""

    reuse_map: tuple[int, ...] | None
    seed_ppls: tuple[float, float | None]
    seed: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"reuse_map": as_list(self.reuse_map), "seed_ppls": list(self.seed_ppls), "seed": self.seed}


# ----------------------------------------------------------------------------------------------------
# The audit


@dataclass(frozen=True)
class AuditedMap:
    reuse_map: str  # the map's key, e.g. "2,1,1,1", or "2,1,1,1|injection=add" with knobs on
    flops_ratio: float
    proxy_state: str  # COMPLETE | PRUNED | FAIL
    proxy_ppl: float | None  # final proxy perplexity (None when pruned or failed)
    pruned_at_step: int | None
    audit_ppl: float  # mean over the audit's seeds
    audit_ppls: tuple[float, ...]
    on_proxy_front: bool
    on_audit_front: bool


@dataclass(frozen=True)
class AuditReport:
    factor: str
    steps: int
    maps: tuple[AuditedMap, ...]
    n_maps: int  # maps with both a proxy and an audit perplexity (what Spearman and Kendall are over)
    spearman: float | None
    kendall: float | None
    front_precision: float | None  # of the proxy front's audited maps, the share on the audited front
    front_recall: float | None  # of the audited front, the share the proxy front holds
    pruned_on_audited_front: tuple[str, ...]
    baseline_ppl: float | None
    best_recurrent: tuple[str, float] | None  # (map, audit ppl)
    finding: str  # one line: the proxy's ranking against the audit's, and what the audit says of recurrence
    # the best recurrent map against the baseline, paired by seed (stats.paired_comparison at 90%): the seeds
    # they share, and whether the recurrent map is better beyond the noise
    best_vs_baseline_seeds: int = 0
    best_beats_baseline: bool = False
    # whether the factor-x runs tell the audited maps apart at all: a one-way ANOVA over the seeds of the maps
    # audited at two or more (its p; None with fewer than 3 such maps). A ranking they do not separate is no
    # yardstick for the proxy's.
    maps_differ_p: float | None = None
    maps_with_seeds: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdict"] = d.pop("finding")  # `audit --json` calls it verdict (the CLI contract)
        d["maps"] = [asdict(m) for m in self.maps]
        return d


AUDIT_CONFIDENCE = 0.9  # of the paired test behind "beats the baseline" (the race's default too)
SEPARATE_P = 1 - AUDIT_CONFIDENCE  # the ANOVA's p below which the audited maps differ beyond their seed noise


def audit_report(trials: Sequence[TrialRecord], rows: Sequence[Run], factor: str) -> AuditReport | None:
    """The audit at `factor` from its stored rows (complete ones; the race's equal-compute models are no maps of
    the study, and are left out) and the study's trials; None before any audited map is complete."""
    done: dict[str, list[Run]] = {}
    for r in rows:
        if (
            r.job.factor == factor
            and r.state == "complete"
            and r.val_ppl is not None
            and Map.form_of(r.job.map_key) != "deeper"
        ):
            done.setdefault(r.job.map_key, []).append(r)
    if not done:
        return None
    by_map = trained_by_map(trials)
    numbers = {r.number: r for r in trials}
    proxy_front = {numbers[cast(int, p.trial)].map_key for p in study_front(trials)}  # a proxy point's trial
    keys = sorted(done)
    ppls = {k: [r.val_ppl for r in done[k] if r.val_ppl is not None] for k in keys}  # done: each has a perplexity
    audit_ppl = {k: statistics.fmean(ppls[k]) for k in keys}
    ratio = {k: done[k][0].flops_ratio for k in keys}
    audit_front = {keys[i] for i in non_dominated([(audit_ppl[k], ratio[k]) for k in keys])}
    maps = []
    for k in keys:
        t = by_map.get(k)
        state = t.state.name if t is not None else "REFERENCE"
        proxy_ppl = t.val_ppl if t is not None and t.state == TrialState.COMPLETE else None
        maps.append(
            AuditedMap(
                k,
                ratio[k],
                state,
                proxy_ppl,
                t.pruned_at_step if t is not None else None,
                audit_ppl[k],
                tuple(ppls[k]),
                k in proxy_front,
                k in audit_front,
            )
        )
    ranked = [(m.proxy_ppl, m.audit_ppl) for m in maps if m.proxy_ppl is not None]
    rho, tau = rank_agreement([proxy for proxy, _ in ranked], [audit for _, audit in ranked])
    proxy_front_audited = {m.reuse_map for m in maps if m.on_proxy_front}
    hits = len(proxy_front_audited & audit_front)
    precision = hits / len(proxy_front_audited) if proxy_front_audited else None
    recall = hits / len(audit_front) if audit_front else None
    pruned_front = tuple(m.reuse_map for m in maps if m.on_audit_front and m.proxy_state == "PRUNED")
    baseline = next((m.audit_ppl for m in maps if is_baseline_key(m.reuse_map)), None)
    recurrent = [m for m in maps if not is_all_ones_key(m.reuse_map)]
    best = min(recurrent, key=lambda m: m.audit_ppl) if recurrent else None
    steps = max(r.steps for rs in done.values() for r in rs)
    baseline_key = next((m.reuse_map for m in maps if is_baseline_key(m.reuse_map)), None)
    paired = None
    if best is not None and baseline_key is not None:
        by_seed = {
            k: {r.job.seed: r.val_loss for r in done[k] if r.val_loss is not None}
            for k in (best.reuse_map, baseline_key)
        }
        paired = paired_comparison(by_seed[best.reuse_map], by_seed[baseline_key], AUDIT_CONFIDENCE)
    differ_p, with_seeds = groups_differ([m.audit_ppls for m in maps])
    report = AuditReport(
        factor,
        steps,
        tuple(maps),
        len(ranked),
        rho,
        tau,
        precision,
        recall,
        pruned_front,
        baseline,
        (best.reuse_map, best.audit_ppl) if best else None,
        "",
        paired.n if paired else 0,
        bool(paired and paired.a_better),
        differ_p,
        with_seeds,
    )
    return AuditReport(**{**asdict(report), "maps": report.maps, "finding": audit_finding(report)})


def audit_reports(trials: Sequence[TrialRecord], rows: Sequence[Run]) -> list[AuditReport]:
    """One report per audited factor, in increasing factor."""
    rows = [r for r in rows if Map.form_of(r.job.map_key) != "deeper"]
    factors = sorted({r.job.factor for r in rows}, key=float)
    return [a for a in (audit_report(trials, rows, f) for f in factors) if a is not None]


def audit_finding(r: AuditReport) -> str:
    """One line: does the proxy rank maps as `factor`x training does, and what the audit says of recurrence."""
    n = f"over {r.n_maps} maps"
    if r.spearman is None:
        head = f"too few ranked maps to judge the proxy ({r.n_maps} with both a proxy and a {r.factor}x result)"
    elif r.maps_differ_p is not None and r.maps_differ_p >= SEPARATE_P:
        head = (
            f"the {r.factor}x runs do not tell the {r.maps_with_seeds} maps audited at several seeds apart "
            f"(one-way ANOVA p = {r.maps_differ_p:.2f}), so the proxy's ranking (Spearman {r.spearman:.2f} {n}) "
            f"cannot be judged against theirs; more seeds (--seeds) or a longer audit would"
        )
    elif r.spearman >= AGREE_SPEARMAN:
        head = f"proxy ranks agree with {r.factor}x training (Spearman {r.spearman:.2f} {n})"
    elif r.spearman >= PARTLY_SPEARMAN:
        head = (
            f"proxy ranks only partly agree with {r.factor}x training (Spearman {r.spearman:.2f} {n}): "
            "close maps may swap"
        )
    else:
        head = (
            f"proxy too short: its ranking disagrees with {r.factor}x training (Spearman {r.spearman:.2f} {n}); "
            "lengthen the proxy (--steps) before trusting the front"
        )
    parts = [head]
    if r.pruned_on_audited_front:
        parts.append(f"pruning discarded {', '.join(r.pruned_on_audited_front)}, on the {r.factor}x front")
    if r.baseline_ppl is not None and r.best_recurrent is not None:
        key, ppl = r.best_recurrent
        if ppl < r.baseline_ppl and r.best_beats_baseline:
            parts.append(
                f"at {r.factor}x, recurrent map {key} beats the baseline (ppl {ppl:.3f} vs {r.baseline_ppl:.3f}; "
                f"paired over {r.best_vs_baseline_seeds} seeds, {AUDIT_CONFIDENCE:.0%} confidence)"
            )
        elif ppl < r.baseline_ppl:
            parts.append(
                f"at {r.factor}x, recurrent map {key} has a lower mean perplexity than the baseline (ppl {ppl:.3f} "
                f"vs {r.baseline_ppl:.3f}), not beyond the seed noise "
                + (
                    f"({r.best_vs_baseline_seeds} common seeds)"
                    if r.best_vs_baseline_seeds >= 2
                    else "(one seed: untested; audit --seeds 3 tests it)"
                )
            )
        else:
            parts.append(
                f"at {r.factor}x, no audited recurrent map beats the baseline (best {key}: ppl {ppl:.3f} vs "
                f"{r.baseline_ppl:.3f})"
            )
    return "; ".join(parts)


# ----------------------------------------------------------------------------------------------------
# The study's fidelity, as `run`, `trials` and `pareto` show it


@dataclass(frozen=True)
class Fidelity:
    """How far a study's proxy can be trusted (study_fidelity): the rung agreement, the baseline's seed noise, the
    best recurrent map and its second seed, the audits, and a one-line verdict. to_dict is the `fidelity` object of
    the JSON reports."""

    rungs: tuple[RungAgreement, ...]
    noise: NoiseBand | None
    best_recurrent: BestRecurrent | None
    second_seed: SecondSeed | None
    audits: tuple[AuditReport, ...]
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        return record_json(self)


def study_fidelity(
    study_name: str,
    trials: Sequence[TrialRecord],
    curves: Curves,
    references: Mapping[str, Run],
    final_step: int,
    audits: Sequence[AuditReport] = (),
) -> Fidelity:
    """Rung agreement, noise, the second seed of the best recurrent map, the audits, and one line of how far the
    proxy agrees with longer training (fidelity_agreement; the JSON key `verdict`)."""
    rungs = rung_agreements(map_curves(trials, curves), final_step)
    noise = noise_band(trials, references)
    best = best_recurrent(trials)
    second = None
    if best is not None:
        ref = references.get("second_seed")
        if ref is not None and ref.reuse_map is not None and list(ref.reuse_map) == as_list(best.reuse_map):
            second = SecondSeed(best.reuse_map, (best.val_ppl, ref.val_ppl), ref.seed)
    front = study_front(trials)
    baseline_only = bool(front) and all(is_baseline(as_list(p.reuse_map)) for p in front)
    latest = audits[-1] if audits else None
    return Fidelity(
        tuple(rungs),
        noise,
        best,
        second,
        tuple(audits),
        fidelity_agreement(study_name, rungs, noise, best, second, baseline_only, latest),
    )


def fidelity_agreement(
    study_name: str,
    rungs: Sequence[RungAgreement],
    noise: NoiseBand | None,
    best: BestRecurrent | None,
    second: SecondSeed | None,
    baseline_only: bool,
    audit: AuditReport | None,
) -> str:
    """One line: how far the proxy's ranking agrees with longer training (the latest audit's finding where there is
    one; else the rungs' agreement with the final ranking, the seed noise and the second seed)."""
    if audit is not None:
        return f"audit: {audit.finding}"
    parts = []
    shown = [f"{_fraction(r.fraction)} {_signed(r.spearman)}" for r in rungs if r.n_maps >= 3]
    if shown:
        parts.append(f"rung-to-final Spearman over {max(r.n_maps for r in rungs)} complete maps: {', '.join(shown)}")
    if any(r.spearman is not None and r.spearman < 0 for r in rungs):
        parts.append("early ranks run backwards (curves cross)")
    if baseline_only and best is not None:
        parts.append(
            "no recurrent map beat the baseline at this proxy length "
            f"(best {best.map or format_reuse_map(best.reuse_map or ())}: "
            f"ppl {best.val_ppl:.3f}); recurrent maps often overtake later"
        )
    if second is not None and None not in second.seed_ppls:
        a, b = second.seed_ppls
        parts.append(f"{format_reuse_map(second.reuse_map or ())} at two seeds: ppl {a:.3f} and {b:.3f}")
    if noise:
        parts.append(f"baseline seed spread {noise.spread:.3f} ppl")
    parts.append(f"not audited: `ilr-search audit --study {study_name}` checks the ranking at 4x training")
    return "; ".join(parts)


def _fraction(f: float) -> str:
    for d in (2, 4, 8, 16, 32):
        if abs(f * d - round(f * d)) < 1e-6 and round(f * d) == 1:
            return f"1/{d}"
    return f"{f:.2f}"


def _signed(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.2f}"
