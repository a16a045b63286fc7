"""Statistics of the search: rank agreement between two rankings (scipy's Spearman and Kendall), and the seed
statistics of the race (racing.py): a t interval of a map's mean loss over its seeds, and a paired comparison of
two maps over their common seeds.

Why a paired t test. Seed s fixes both a model's initial weights and its batch order (common random numbers),
so two maps trained at the same seed share most of their noise. The paired test works on the per-seed
differences d_s = loss_a(s) - loss_b(s): their spread is each map's own spread (a recurrent map's is often far
larger than the baseline's) minus what the shared seed explains, and no equal-variance assumption is made (a
pooled two-sample t test would assume one). With the 2-4 seeds a race can afford, rank tests cannot decide:
the one-sided Wilcoxon signed-rank test's smallest p-value at 3 seeds is 1/8, so at 90% confidence it could
never reject. The t test assumes roughly normal differences; it is what scipy.stats.ttest_rel computes.

"a is better than b at confidence c" means the two-sided t interval of the mean difference at c lies wholly
below zero: the interval shown with a decision never straddles zero. That is the one-sided test at level
(1 - c) / 2 (5% at c = 0.9); the one-sided p-value is reported."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def groups_differ(groups: Sequence[Sequence[float]]) -> tuple[float | None, int]:
    """One-way ANOVA p (scipy's f_oneway) that the groups' means differ, over the groups of two or more values
    (their number too); None with fewer than 3 such groups. The audit's groups: each map's seeds."""
    kept = [list(g) for g in groups if len(g) >= 2]
    if len(kept) < 3:
        return None, len(kept)
    from scipy.stats import f_oneway

    p = float(f_oneway(*kept).pvalue)
    return (p if math.isfinite(p) else None), len(kept)


def rank_agreement(a: Sequence[float], b: Sequence[float]) -> tuple[float | None, float | None]:
    """(Spearman rho, Kendall tau-b) of paired values; None where undefined (fewer than 3 pairs, or a
    constant side)."""
    if len(a) != len(b):
        raise ValueError(f"rank agreement needs paired values, got {len(a)} and {len(b)}")
    if len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return None, None
    from scipy.stats import kendalltau, spearmanr

    rho = float(spearmanr(a, b)[0])
    tau = float(kendalltau(a, b)[0])
    return (rho if math.isfinite(rho) else None), (tau if math.isfinite(tau) else None)


@dataclass(frozen=True)
class SeedInterval:
    """A map's mean validation loss over its seeds, with a two-sided t interval at `confidence`: None with one
    seed (no spread is known, so no interval is claimed)."""

    n: int
    mean_loss: float
    sd_loss: float | None  # sample standard deviation (ddof 1); None with one seed
    interval_loss: tuple[float, float] | None
    confidence: float

    @property
    def val_ppl(self) -> float:
        return math.exp(self.mean_loss)

    @property
    def interval_ppl(self) -> tuple[float, float] | None:
        """The loss interval in perplexity (exp is monotone, so the interval maps through it)."""
        if self.interval_loss is None:
            return None
        return math.exp(self.interval_loss[0]), math.exp(self.interval_loss[1])


def decision_level(confidence: float) -> float:
    """The one-sided level of "better at `confidence`": the two-sided interval at `confidence` excludes zero."""
    return (1 - confidence) / 2


@functools.lru_cache(maxsize=8192)
def t_critical(confidence: float, dof: int, two_sided: bool = True) -> float:
    """Student t quantile: the half-width multiplier of a two-sided (or the bound of a one-sided) interval (kept:
    a verdict's seeds_needed asks for hundreds of them)."""
    from scipy.stats import t

    return float(t.ppf((1 + confidence) / 2 if two_sided else confidence, dof))


def seed_interval(losses: Sequence[float], confidence: float) -> SeedInterval:
    """Mean of `losses` (one per seed) with its two-sided Student t interval at `confidence`."""
    if not losses:
        raise ValueError("a seed interval needs at least one loss")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    n = len(losses)
    mean = math.fsum(losses) / n
    if n < 2:
        return SeedInterval(n, mean, None, None, confidence)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in losses) / (n - 1))
    if sd == 0:
        return SeedInterval(n, mean, sd, (mean, mean), confidence)
    _, low, high = t_test(losses, confidence)
    return SeedInterval(n, mean, sd, (low, high), confidence)


@dataclass(frozen=True)
class PairedComparison:
    """Map a against map b over their common seeds: mean of loss_a - loss_b (negative: a is better), its
    two-sided t interval at `confidence`, and the one-sided paired t test of "a is better than b"."""

    seeds: tuple[int, ...]
    mean_diff: float
    sd_diff: float | None  # None with one common seed
    interval: tuple[float, float] | None  # two-sided, at confidence; None with fewer than 2 common seeds
    p_value: float  # one-sided, H1: mean_diff < 0; 1.0 where nothing can be tested
    confidence: float

    @property
    def n(self) -> int:
        return len(self.seeds)

    @property
    def alpha(self) -> float:
        return decision_level(self.confidence)

    @property
    def a_better(self) -> bool:
        """a beats b at `confidence`: at least 2 common seeds and the interval wholly below zero (the one-sided
        p-value below (1 - confidence) / 2)."""
        return self.n >= 2 and self.p_value < self.alpha

    def seeds_needed(self, max_seeds: int = 1000) -> int | None:
        """Seeds at which the observed mean difference, with the observed sd, would clear its interval
        (t_{(1 + confidence) / 2, n-1} * sd / sqrt(n) < |mean_diff|); None when the sd is unknown or the gap is
        zero or more than max_seeds would be needed."""
        if self.sd_diff is None or self.mean_diff == 0:
            return None
        if self.sd_diff == 0:
            return 2
        for n in range(2, max_seeds + 1):
            if t_critical(self.confidence, n - 1) * self.sd_diff / math.sqrt(n) < abs(self.mean_diff):
                return n
        return None


def paired_comparison(a: Mapping[int, float], b: Mapping[int, float], confidence: float) -> PairedComparison:
    """Compare two maps' losses by seed ({seed: val_loss}) over their common seeds (scipy.stats.ttest_rel,
    alternative "less"). Differences with no spread (sd 0) are decided by their sign."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    seeds = tuple(sorted(set(a) & set(b)))
    diffs = [a[s] - b[s] for s in seeds]
    if not diffs:
        return PairedComparison(seeds, math.nan, None, None, 1.0, confidence)
    n = len(diffs)
    mean = math.fsum(diffs) / n
    if n < 2:
        return PairedComparison(seeds, mean, None, None, 1.0, confidence)
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in diffs) / (n - 1))
    if sd == 0:
        return PairedComparison(seeds, mean, sd, (mean, mean), 0.0 if mean < 0 else 1.0, confidence)
    import numpy as np

    p, low, high = t_test(np.asarray([a[s] for s in seeds]) - np.asarray([b[s] for s in seeds]), confidence)
    return PairedComparison(seeds, mean, sd, (low, high), p, confidence)


def t_test(values: Sequence[float], confidence: float) -> tuple[float, float, float]:
    """The one-sample t test of `values` (two or more, with a spread) against 0: the one-sided p-value of a mean
    below 0, and the two-sided interval of the mean at `confidence`. The numbers of scipy.stats.ttest_1samp(values,
    0.0, alternative="less") and its confidence_interval(confidence) to the bit (tests/test_stats.py checks them),
    computed as scipy computes them, without its array-API wrapper: the race reads every comparison again after each
    run, and the wrapper took most of its time."""
    import numpy as np
    from scipy import special

    x = np.asarray(values, dtype=np.float64)
    n = x.shape[0]
    mean = np.mean(x, axis=0)
    variance = np.mean((x - np.mean(x, axis=0, keepdims=True)) ** 2, axis=0)
    variance *= np.float64(n) / (np.float64(n) - 1)
    standard_error = np.sqrt(variance / n)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.divide(mean - np.float64(0.0), standard_error)
    tail = (1 - np.float64(confidence)) / 2
    low, high = special.stdtrit(n - 1, np.stack((tail, 1 - tail)))
    p_below = special.stdtr(np.float64(n - 1), t)
    return float(p_below), float(low * standard_error + mean), float(high * standard_error + mean)
