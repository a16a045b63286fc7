"""Tests paired by unit: a frozen race's comparisons, where every chunk holds many units (held-out windows or task
items) that two maps both scored.

A frozen race's replicate is a chunk, but a chunk's mean hides what pairing by unit shows: two maps scored on the
same window or item share most of its difficulty, so the differences unit by unit (map minus baseline) have a
spread far below that of the chunks' means. The race still looks chunk by chunk (a look after the chunks its
schedule names, sequential.look_schedule), over every unit of the chunks so far:

- scores that are losses (a window's mean loss, an answer's): the paired t statistic of the unit differences
  against group-sequential boundaries. The boundaries are those of Lan-DeMets O'Brien-Fleming alpha spending for a
  z statistic at the information fractions k / K (chunks hold equal numbers of units), simulated once per design,
  each turned into the t quantile of the same tail at the look's degrees of freedom;
- scores that are 0 or 1 (an item right or wrong): an exact sequential sign test on the discordant items (the map
  right where the baseline is wrong, or the reverse; the others say nothing about which is better). Under the
  null, given which items are discordant, each discordant item favours either side with probability 1/2, so the
  count for the map is a binomial random walk: at each look the boundary is the smallest count whose tail, among
  the null paths not claimed before, spends no more than that look's share of alpha (computed exactly). Its level
  holds for any number of items, however few are discordant.

`UnitPairs` holds one comparison's differences, chunk by chunk; `UnitTest` is the sequential test of one level.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ilr_search.analysis.sequential import MIN_LEVEL, detectable_gap, look_schedule, obrien_fleming_spent

Z_PATHS = 200_000
Z_SEED = 20261203


@dataclass(frozen=True)
class UnitPairs:
    """Differences (loss_a - loss_b: negative where a is better) of units paired within each of `chunks`, in
    chunk order; `binary` where every score is 0 or 1 (each difference -1, 0 or 1)."""

    chunks: tuple[int, ...]
    diffs: tuple[tuple[float, ...], ...]
    binary: bool

    def shifted(self, delta: float) -> UnitPairs:
        """The pairs with every difference plus `delta`: a test of "a is better by more than delta" (losses only;
        0/1 differences are left as they are)."""
        if self.binary or not delta:
            return self
        return UnitPairs(self.chunks, tuple(tuple(d + delta for d in chunk) for chunk in self.diffs), False)

    def reversed(self) -> UnitPairs:
        """b against a."""
        return UnitPairs(self.chunks, tuple(tuple(-d for d in chunk) for chunk in self.diffs), self.binary)

    def upto(self, k: int) -> list[float]:
        """The differences of the first k chunks."""
        return [d for chunk in self.diffs[:k] for d in chunk]

    @property
    def n(self) -> int:
        """Units paired."""
        return sum(len(c) for c in self.diffs)

    def mean(self, k: int | None = None) -> float | None:
        d = self.upto(len(self.chunks) if k is None else k)
        return math.fsum(d) / len(d) if d else None

    def sd(self, k: int | None = None) -> float | None:
        d = self.upto(len(self.chunks) if k is None else k)
        if len(d) < 2:
            return None
        mean = math.fsum(d) / len(d)
        return math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (len(d) - 1))

    def discordant(self, k: int | None = None) -> tuple[int, int]:
        """(units where a is better, units where b is better) over the first k chunks: for 0/1 scores, items a got
        right and b wrong, and the reverse."""
        d = self.upto(len(self.chunks) if k is None else k)
        return sum(1 for x in d if x < 0), sum(1 for x in d if x > 0)

    def statistic(self, k: int | None = None) -> float | None:
        """Oriented so that positive means a is better: the paired t of the first k chunks' differences, or for 0/1
        scores McNemar's z, (a better - b better) / sqrt(discordant). None with fewer than 2 units."""
        d = self.upto(len(self.chunks) if k is None else k)
        if len(d) < 2:
            return None
        if self.binary:
            better, worse = self.discordant(k)
            return (better - worse) / math.sqrt(better + worse) if better + worse else 0.0
        mean, sd = math.fsum(d) / len(d), self.sd(k)
        assert sd is not None  # two or more differences
        if sd == 0:
            return math.inf if mean < 0 else (-math.inf if mean > 0 else 0.0)
        return -mean / (sd / math.sqrt(len(d)))

    def interval(self, confidence: float) -> tuple[float, float] | None:
        """The two-sided interval of the mean difference at `confidence`: mean +- t sd / sqrt(n) (for 0/1 scores the
        same, the Wald interval of a difference of paired proportions)."""
        mean, sd = self.mean(), self.sd()
        if mean is None or sd is None:
            return None
        from scipy.stats import t

        half = float(t.ppf((1 + confidence) / 2, self.n - 1)) * sd / math.sqrt(self.n)
        return mean - half, mean + half

    def p_value(self) -> float:
        """One-sided, H1: a is better, as if the units had been fixed in advance (nominal): the paired t test's, or
        for 0/1 scores the exact sign test's on the discordant items."""
        from scipy.stats import binom
        from scipy.stats import t as student

        stat = self.statistic()
        if stat is None:
            return 1.0
        if self.binary:
            better, worse = self.discordant()
            return float(binom.sf(better - 1, better + worse, 0.5)) if better + worse else 1.0
        if math.isinf(stat):
            return 0.0 if stat > 0 else 1.0
        return float(student.sf(stat, self.n - 1))


def unit_pairs(
    a: Mapping[int, Sequence[float]], b: Mapping[int, Sequence[float]], chunks: Sequence[int], binary: bool
) -> UnitPairs:
    """The unit differences a - b on each of `chunks` (in that order) that both scored with the same units."""
    kept = [c for c in chunks if c in a and c in b and len(a[c]) == len(b[c]) and len(a[c])]
    return UnitPairs(tuple(kept), tuple(tuple(x - y for x, y in zip(a[c], b[c], strict=True)) for c in kept), binary)


@functools.lru_cache(maxsize=256)
def z_boundaries(alpha: float, first_look: int, max_n: int, every: int = 1) -> tuple[float, ...]:
    """One-sided boundaries of a z statistic at the looks (in chunks) of look_schedule(first_look, max_n, every),
    information fraction k / max_n: Lan-DeMets O'Brien-Fleming spending over simulated Brownian paths (a fixed seed,
    Z_PATHS paths). inf where a look spends less than one path's worth."""
    import numpy as np

    looks = look_schedule(first_look, max_n, every)
    rng = np.random.default_rng(Z_SEED)
    total = np.zeros(Z_PATHS)
    alive = np.ones(Z_PATHS, dtype=bool)
    spent_before, out = 0.0, []
    for k in range(1, max_n + 1):
        total += rng.standard_normal(Z_PATHS)
        if k not in looks:
            continue
        z = total / math.sqrt(k)
        allowed = int(math.floor((obrien_fleming_spent(alpha, k / max_n) - spent_before) * Z_PATHS))
        candidates = np.sort(z[alive])[::-1]
        if allowed < 1 or not len(candidates):
            out.append(math.inf)
            continue
        boundary = float(candidates[min(allowed, len(candidates)) - 1])
        out.append(boundary)
        crossed = alive & (z >= boundary)
        alive &= ~crossed
        spent_before += crossed.sum() / Z_PATHS
    return tuple(out)


def t_boundary(z: float, dof: int) -> float:
    """The t quantile with the one-sided tail of the z boundary `z` at `dof` degrees of freedom."""
    if not math.isfinite(z) or dof < 1:
        return z
    from scipy.stats import norm
    from scipy.stats import t as student

    return float(student.isf(norm.sf(z), dof))


@functools.lru_cache(maxsize=4096)
def sign_boundaries(
    alpha: float, looks: tuple[int, ...], max_n: int, discordant: tuple[int, ...]
) -> tuple[int | None, ...]:
    """The exact sequential sign test's boundaries: at the look after chunk looks[j], with discordant[j] discordant
    items so far (non-decreasing), the smallest count for a that claims (None: none can). Each look spends up to
    OBF(alpha, looks[j] / max_n) of alpha in all, exactly, over the null's binomial random walk."""
    import numpy as np
    from scipy.stats import binom

    alive = np.ones(1)  # P(count = c, not claimed before), c = 0..discordant so far
    spent, out, seen = 0.0, [], 0
    for look, m in zip(looks, discordant, strict=True):
        if m > seen:
            alive = np.convolve(alive, binom.pmf(np.arange(m - seen + 1), m - seen, 0.5))
        seen = m
        allowed = obrien_fleming_spent(alpha, look / max_n) - spent
        tails = np.cumsum(alive[::-1])[::-1]  # tails[c] = P(count >= c, not claimed before)
        fits = np.flatnonzero(tails <= allowed * (1 + 1e-9))
        boundary = int(fits[0]) if len(fits) and tails[fits[0]] > 0 else None
        if boundary is not None:
            spent += float(tails[boundary])
            alive[boundary:] = 0.0
        out.append(boundary)
    return tuple(out)


@dataclass(frozen=True)
class UnitTest:
    """The sequential test of "a is better than b" at one-sided level `alpha`, looking after chunk first_look, then
    every `every` chunks, and at max_n chunks (see the module docstring)."""

    alpha: float
    first_look: int
    max_n: int
    every: int = 1

    @property
    def looks(self) -> tuple[int, ...]:
        return look_schedule(self.first_look, self.max_n, self.every)

    def _at(self, pairs: UnitPairs) -> list[tuple[int, float, float]]:
        """(look, statistic, boundary) at each look the pairs reached."""
        reached = [look for look in self.looks if look <= len(pairs.chunks)]
        if self.alpha < MIN_LEVEL or not reached:
            return []
        if pairs.binary:
            counts = [sum(pairs.discordant(k)) for k in reached]
            bounds = sign_boundaries(round(self.alpha, 12), tuple(reached), self.max_n, tuple(counts))
            out = []
            for k, m, c in zip(reached, counts, bounds, strict=True):
                better = pairs.discordant(k)[0]
                # the count boundary as McNemar's z: (2c - m) / sqrt(m), the statistic this compares with
                z = math.inf if c is None or not m else (2 * c - m) / math.sqrt(m)
                out.append((k, (2 * better - m) / math.sqrt(m) if m else 0.0, z))
            return out
        zs = z_boundaries(round(self.alpha, 12), self.first_look, self.max_n, self.every)
        out = []
        for k in reached:
            stat = pairs.statistic(k)
            n = len(pairs.upto(k))
            out.append((k, -math.inf if stat is None else stat, t_boundary(zs[self.looks.index(k)], n - 1)))
        return out

    def crossed_at(self, pairs: UnitPairs) -> int | None:
        """The first look (chunks) at which the test claims that a is better; None if it has not."""
        return next((k for k, stat, bound in self._at(pairs) if stat >= bound), None)

    def boundary(self, pairs: UnitPairs) -> float | None:
        """The statistic's boundary at the last look the pairs reached (None before the first)."""
        at = self._at(pairs)
        return at[-1][2] if at else None

    def interval(self, pairs: UnitPairs) -> tuple[float, float] | None:
        """The repeated confidence interval of the mean difference at the last look the pairs reached: the mean plus
        and minus the boundary (as a statistic) times its standard error (for 0/1 scores McNemar's,
        sqrt(discordant) / n). It excludes 0 exactly where the test, or the same test the other way, claims; run at
        level alpha each way its coverage is at least 1 - 2 alpha. None before the first look, or where no count of
        the discordant items could claim yet."""
        bound, mean = self.boundary(pairs), pairs.mean()
        if bound is None or mean is None or not math.isfinite(bound):
            return None
        if pairs.binary:
            half = bound * math.sqrt(sum(pairs.discordant())) / pairs.n
        else:
            sd = pairs.sd()
            if sd is None:
                return None
            half = bound * sd / math.sqrt(pairs.n)
        return mean - half, mean + half


def unit_detectable_gap(pairs: UnitPairs, test: UnitTest, power: float) -> float | None:
    """The smallest true mean difference (in the score's unit: nats, or a share of items for 0/1 scores) that the
    test at the chunks `pairs` reached finds with probability `power`, given their spread: for losses the noncentral
    t at the look's boundary (sequential.detectable_gap); for 0/1 scores the normal approximation of McNemar's z,
    (boundary + z_power) sqrt(discordant share / n)."""
    if pairs.n < 2 or test.alpha < MIN_LEVEL:
        return None
    if not pairs.binary:
        bound, sd = test.boundary(pairs), pairs.sd()
        if bound is None or not math.isfinite(bound) or not sd:
            return None
        return detectable_gap(sd, pairs.n, test.alpha, power, boundary=bound)
    from scipy.stats import norm

    reached = [look for look in test.looks if look <= len(pairs.chunks)]
    if not reached:
        return None
    # the z boundary the exact boundary approximates (the exact one is undefined with no discordant item yet)
    bound = z_boundaries(round(test.alpha, 12), test.first_look, test.max_n, test.every)[test.looks.index(reached[-1])]
    share = max(sum(pairs.discordant()), 1) / pairs.n  # at least one discordant item in n
    return (bound + float(norm.ppf(power))) * math.sqrt(share / pairs.n)
