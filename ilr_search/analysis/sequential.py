"""Sequential tests of "map a beats the baseline" that keep their error rate while the race looks as seeds come in,
and the gap such a test could detect.

The adaptive race (adaptive_race.py) adds seeds to a comparison until it is decided, and tests after each one.
Repeating a fixed-sample t test at every look inflates its false-claim rate: at looks after seeds 2..11 a one-sided
5% paired t test claims about three times as often under the null (tests/test_sequential.py measures it). Two
tests that keep their level are here; `SequentialTest.kind` picks one:

- "spending": a group-sequential paired t test with Lan-DeMets alpha spending of O'Brien-Fleming type,
  alpha(f) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(f)) at the share f = n / max_n of the seeds. The boundary at each
  look is the t value that spends that look's share of alpha among the null paths that have not crossed before.
  For normal differences the null path of t statistics does not depend on their sd, so the boundaries are
  simulated once per design (a fixed seed, 200,000 paths) and hold whatever the sd. A look the race skips only
  makes the test more conservative, and so does stopping early without a claim (futility, a compute cap).
- "evalue": an always-valid test. The paired t test's Bayes factor against a half-normal prior on the standardized
  effect (scale `prior_scale`) is a likelihood ratio of the scale-invariant reduction of the data, so it is a
  test martingale under the null (Perez-Ortiz, Lardy, de Heide and Grunwald 2024); it claims once it reaches
  1 / alpha, at any number of looks and under any stopping rule.

O'Brien-Fleming spending keeps almost all of alpha for the last looks, so at the race's 2-12 seeds it loses little
power against a fixed-sample test, and it stops early only for large gaps. The e-value test needs a Bayes factor
of 20 at alpha 0.05, which a handful of seeds reaches only for gaps of several sd. benchmarks/power.py measures
both on the truth tables; the race uses "spending" (benchmarks/reports/ has the figures).

Where the looks are: `every` seeds apart after the first, and at the last. A look at few differences spends its
share of alpha at a t boundary far out in the heavy tail of a t with 1 or 2 degrees of freedom, where a real gap
seldom reaches it: with 4 test seeds and looks at 2, 3 and 4 the look at 3 needs t >= 5.7 and leaves the last 2.99
(a fixed-sample test needs 2.63), while looks at 2 and 4 leave it 2.71. Simulated on normal paired differences
(not on any truth table): at a gap of 2 paired sd, power 0.81 -> 0.85 with 4 test seeds, 0.64 -> 0.66 at 1 sd with
7; expected seeds 3-8% more where the race stops early. The race looks every second seed where its pool has at most
FEW_TEST_SEEDS test seeds (looks_apart), and after every seed in a larger pool, where the gain is small."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

TestKind = Literal["spending", "evalue"]
BOUNDARY_PATHS = 200_000
BOUNDARY_SEED = 20261201
MIN_LEVEL = 1e-9  # a comparison held to a smaller level (a fixed sequence's later ones) cannot claim


def obrien_fleming_spent(alpha: float, share: float) -> float:
    """Alpha spent by the share `share` (0..1] of the seeds: Lan-DeMets' O'Brien-Fleming-type function."""
    from scipy.stats import norm

    if share <= 0:
        return 0.0
    return float(2 - 2 * norm.cdf(norm.ppf(1 - alpha / 2) / math.sqrt(min(1.0, share))))


FEW_TEST_SEEDS = 4  # a pool of at most this many test seeds: its looks are every second seed (look_every 0)


def looks_apart(look_every: int, max_n: int) -> int:
    """The seeds between a test's looks: `look_every` where it is 1 or more; 0 (automatic): 2 where the test has at
    most FEW_TEST_SEEDS differences, else 1. Simulated on normal differences (not on the truth tables): looks every
    second seed raise the power at a 2-sd gap from 0.81 to 0.85 with 4 test seeds, and at 1 sd from 0.64 to 0.66 with
    7, where they cost 3-8% more seeds."""
    return look_every if look_every >= 1 else (2 if max_n <= FEW_TEST_SEEDS else 1)


def look_schedule(first_look: int, max_n: int, every: int = 1) -> tuple[int, ...]:
    """The numbers of differences a sequential test looks at: first_look, then every `every` more, and max_n."""
    if every < 1:
        raise ValueError(f"a sequential test looks every 1 or more differences, got {every}")
    return tuple(sorted({*range(first_look, max_n, every), max_n})) if first_look <= max_n else ()


def next_look(looks: Sequence[int], n: int) -> int | None:
    """The first look of `looks` after n differences (None past the last)."""
    return min((look for look in looks if look > n), default=None)


def last_look(looks: Sequence[int], n: int) -> int | None:
    """The last look of `looks` at or before n differences (None before the first)."""
    return max((look for look in looks if look <= n), default=None)


@functools.lru_cache(maxsize=256)
def spending_boundaries(alpha: float, first_look: int, max_n: int, every: int = 1) -> tuple[float, ...]:
    """The one-sided boundaries c_n of the paired t statistic at the looks n of look_schedule(first_look, max_n,
    every), in that order: the test claims at the first look n with t_n >= c_n. inf where a look spends less than one
    simulated path's worth."""
    import numpy as np

    if not 2 <= first_look <= max_n:
        raise ValueError(
            f"a sequential t test looks at 2 or more differences, up to max_n: got first look "
            f"{first_look}, max_n {max_n}"
        )
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    looks = look_schedule(first_look, max_n, every)
    rng = np.random.default_rng(BOUNDARY_SEED)
    total = np.zeros(BOUNDARY_PATHS)
    squares = np.zeros(BOUNDARY_PATHS)
    alive = np.ones(BOUNDARY_PATHS, dtype=bool)
    spent_before = 0.0
    out = []
    for n in range(1, max_n + 1):
        x = rng.standard_normal(BOUNDARY_PATHS)
        total += x
        squares += x * x
        if n not in looks:
            continue
        mean = total / n
        sd = np.sqrt(np.maximum(squares - n * mean * mean, 1e-300) / (n - 1))
        t = mean / (sd / math.sqrt(n))
        spent = obrien_fleming_spent(alpha, n / max_n)
        allowed = int(math.floor((spent - spent_before) * BOUNDARY_PATHS))
        candidates = np.sort(t[alive])[::-1]
        if allowed < 1 or len(candidates) == 0:
            out.append(math.inf)
            continue
        allowed = min(allowed, len(candidates))
        boundary = float(candidates[allowed - 1])
        out.append(boundary)
        crossed = alive & (t >= boundary)
        alive &= ~crossed
        spent_before += crossed.sum() / BOUNDARY_PATHS
    return tuple(out)


def t_statistic(diffs: Sequence[float]) -> float | None:
    """mean / (sd / sqrt(n)) of paired differences, oriented so that positive means "a is better" (a lower loss):
    None with fewer than 2; +-inf where the sd is 0."""
    n = len(diffs)
    if n < 2:
        return None
    mean = math.fsum(diffs) / n
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in diffs) / (n - 1))
    if sd == 0:
        return math.inf if mean < 0 else (-math.inf if mean > 0 else 0.0)
    return -mean / (sd / math.sqrt(n))


@functools.lru_cache(maxsize=65536)
def _bayes_factor(t: float, n: int, prior_scale: float) -> float:
    """The t test's Bayes factor for a positive standardized effect delta ~ half-normal(prior_scale) against
    delta = 0, from the t statistic of n differences (noncentral t likelihood ratio, integrated over delta)."""
    import numpy as np
    from scipy.stats import nct
    from scipy.stats import t as student

    if not math.isfinite(t):
        return math.inf if t > 0 else 0.0
    dof = n - 1
    null = student.pdf(t, dof)
    if null <= 0:
        return math.inf if t > 0 else 0.0
    nodes, weights = np.polynomial.legendre.leggauss(96)  # delta over [0, 8 prior_scale], the prior's mass
    half = 4 * prior_scale
    delta = half * (nodes + 1)
    prior = 2 * np.exp(-0.5 * (delta / prior_scale) ** 2) / (prior_scale * math.sqrt(2 * math.pi))
    return float(half * np.sum(weights * nct.pdf(t, dof, delta * math.sqrt(n)) * prior) / null)


@dataclass(frozen=True)
class SequentialTest:
    """One sequential design: one-sided level `alpha` (of one comparison; the race splits its family's alpha over
    its comparisons, Holm), first look at `first_look` differences, then every `every` more, and at `max_n`, the
    most."""

    alpha: float
    first_look: int
    max_n: int
    kind: TestKind = "spending"
    prior_scale: float = 1.0  # evalue: the half-normal prior's scale on the standardized effect
    every: int = 1

    @property
    def looks(self) -> tuple[int, ...]:
        return look_schedule(self.first_look, self.max_n, self.every)

    def boundary(self, n: int) -> float:
        """The t value the last look at or before n differences had to reach (inf before the first look; the last
        boundary past max_n)."""
        look = last_look(self.looks, min(n, self.max_n))
        if look is None or self.alpha < MIN_LEVEL:
            return math.inf
        if self.kind == "evalue":
            return math.nan  # decided by the Bayes factor, not a t boundary
        bounds = spending_boundaries(round(self.alpha, 12), self.first_look, self.max_n, self.every)
        return bounds[self.looks.index(look)]

    def crossed_at(self, diffs: Sequence[float]) -> int | None:
        """The first look (number of differences, in the order given) at which the test claims that a is better
        (diffs = loss_a - loss_b, negative where a is better); None if it has not."""
        if self.alpha < MIN_LEVEL:
            return None
        for n in (look for look in self.looks if look <= len(diffs)):
            t = t_statistic(diffs[:n])
            if t is None:
                continue
            if self.kind == "evalue":
                if _bayes_factor(round(t, 9), n, self.prior_scale) >= 1 / self.alpha:
                    return n
            elif t >= self.boundary(n):
                return n
        return None


def detectable_gap(
    sd_diff: float, n: int, alpha: float, power: float = 0.8, boundary: float | None = None
) -> float | None:
    """The smallest true gap (in the loss, nats) that a one-sided paired t test over n differences of sd `sd_diff`
    finds with probability `power` at level alpha (or against a given t `boundary`): the gap whose noncentral t
    reaches the boundary with that probability. None with fewer than 2 differences or no sd."""
    from scipy.stats import t as student

    if n < 2 or sd_diff is None or not math.isfinite(sd_diff) or sd_diff <= 0 or alpha < MIN_LEVEL:
        return None
    dof = n - 1
    c = boundary if boundary is not None else float(student.ppf(1 - alpha, dof))
    if not math.isfinite(c) or c > 1e4:
        return None
    ncp = _noncentrality(c, dof, power)
    return None if ncp is None else ncp * sd_diff / math.sqrt(n)


@functools.lru_cache(maxsize=65536)
def _noncentrality(c: float, dof: int, power: float) -> float | None:
    """The noncentrality at which a noncentral t of `dof` degrees exceeds `c` with probability `power` (None past
    1e5). It does not depend on the sd, so the race, which asks again after every run, finds each root once."""
    from scipy.optimize import brentq
    from scipy.stats import nct

    def shortfall(ncp: float) -> float:
        return float(nct.sf(c, dof, ncp)) - power

    high = max(1.0, c + 4.0)
    while not shortfall(high) >= 0:
        high *= 2
        if high > 1e5:
            return None
    return float(brentq(shortfall, 0.0, high, xtol=1e-9))
