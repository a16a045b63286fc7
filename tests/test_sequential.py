"""The sequential tests of the adaptive race (analysis/sequential.py): their false-claim rate on simulated null data
stays within their level however often they look, where a fixed-sample t test repeated at every seed does not;
Holm's split keeps a family of comparisons that share the baseline within the family's level; the detectable
gap is the gap the test finds at the asked power."""

import math
import random

import pytest
from scipy.stats import nct
from scipy.stats import t as student

from ilr_search.analysis.adaptive_race import holm_claims, holm_weights
from ilr_search.analysis.sequential import (
    SequentialTest,
    detectable_gap,
    obrien_fleming_spent,
    spending_boundaries,
    t_statistic,
)

ALPHA, FIRST, MAX_N = 0.05, 2, 11  # the default race's design: seeds 1..11 of a 12-seed pool, first look at 2
SIMULATIONS = 1000


def spending(paths):
    """holm_claims' crossing rule: each path's group-sequential paired t test (the race's "spending") at a level."""
    return lambda key, level: SequentialTest(level, FIRST, MAX_N, "spending").crossed_at(paths[key])


def null_paths(n: int, seed: int = 20261201) -> list[list[float]]:
    rng = random.Random(seed)
    return [[rng.gauss(0.0, 1.0) for _ in range(MAX_N)] for _ in range(n)]


def test_obrien_fleming_spending_spends_alpha_by_the_last_seed_and_little_early():
    assert obrien_fleming_spent(ALPHA, 1.0) == pytest.approx(ALPHA)
    assert obrien_fleming_spent(ALPHA, 0.25) < ALPHA / 50  # a quarter of the seeds spends almost nothing
    shares = [obrien_fleming_spent(ALPHA, n / MAX_N) for n in range(FIRST, MAX_N + 1)]
    assert shares == sorted(shares)


def test_boundaries_are_deterministic_and_stricter_than_the_fixed_test():
    bounds = spending_boundaries(ALPHA, FIRST, MAX_N)
    assert bounds == spending_boundaries(ALPHA, FIRST, MAX_N) and len(bounds) == MAX_N - FIRST + 1
    for n, c in zip(range(FIRST, MAX_N + 1), bounds, strict=True):
        assert c > student.ppf(1 - ALPHA, n - 1)  # every look is stricter than a fixed test at that n
    assert bounds[-1] < bounds[len(bounds) // 2]  # and the boundary falls as seeds accrue


def binomial_ceiling(n: int, rate: float) -> int:
    """The most claims n null simulations of a test of level `rate` give but once in a thousand."""
    from scipy.stats import binom

    return int(binom.ppf(0.999, n, rate))


def test_one_sequential_comparison_is_at_its_level_on_null_data_and_repeated_t_tests_are_not():
    """1,000 null paths (normal differences, mean 0) through one comparison: the spending test, whose level is
    alpha exactly, claims as many as a test of level alpha would (within the binomial noise of 1,000 draws); the same
    looks with a fixed-sample 5% t test at every seed claim about three times as often."""
    paths = null_paths(SIMULATIONS)
    test = SequentialTest(ALPHA, FIRST, MAX_N)
    claims = sum(test.crossed_at(p) is not None for p in paths)
    naive = sum(
        any(t_statistic(p[:n]) >= student.ppf(1 - ALPHA, n - 1) for n in range(FIRST, MAX_N + 1)) for p in paths
    )
    assert claims <= binomial_ceiling(SIMULATIONS, ALPHA)
    assert naive > binomial_ceiling(SIMULATIONS, 2 * ALPHA)  # the failure the sequential test exists for


def test_holm_over_two_contenders_sharing_the_baseline_keeps_the_family_level():
    """1,000 null studies of a baseline and two contenders, all equal (their differences share the baseline's
    noise), tested as the race tests them: at most alpha of them claim either contender."""
    rng = random.Random(7)
    weights = holm_weights(["a", "b"], 0.5)
    claimed = 0
    for _ in range(SIMULATIONS):
        base = [rng.gauss(0, 1) for _ in range(MAX_N)]
        paths = {k: [rng.gauss(0, 1) - b for b in base] for k in ("a", "b")}
        claims, _ = holm_claims(list(paths), weights, ALPHA, spending(paths))
        claimed += bool(claims)
    assert claimed / SIMULATIONS <= ALPHA


def test_holm_passes_a_claims_share_on():
    weights = holm_weights(["a", "b"], 0.8)
    assert weights == {"a": 0.8, "b": pytest.approx(0.2)}
    sure = [-1.0, -1.01, -0.99, -1.0, -1.02, -0.98, -1.0, -1.0, -1.01, -0.99, -1.0]  # far better, tiny spread
    rng = random.Random(3)
    noise = [rng.gauss(0, 1) for _ in range(MAX_N)]
    mean = sum(noise) / MAX_N
    sd = math.sqrt(sum((x - mean) ** 2 for x in noise) / (MAX_N - 1))
    modest = [-0.5 + (x - mean) / sd * 0.5 * math.sqrt(MAX_N) / 2.5 for x in noise]  # t = 2.5 over all 11
    assert t_statistic(modest) == pytest.approx(2.5)
    alone, _ = holm_claims(["b"], {"b": 1.0}, 0.2 * ALPHA, spending({"b": modest}))
    assert not alone  # at its own share of the level it is not claimed...
    claims, levels = holm_claims(["a", "b"], weights, ALPHA, spending({"a": sure, "b": modest}))
    assert claims["a"][0] == pytest.approx(0.8 * ALPHA)
    assert claims["b"][0] == pytest.approx(ALPHA) and levels == {}  # ...but once a's share comes to it


def test_the_evalue_test_keeps_its_level_on_null_data():
    paths = null_paths(200, seed=11)  # the e-value costs a noncentral t integral a look: fewer paths
    test = SequentialTest(ALPHA, FIRST, MAX_N, kind="evalue")
    assert sum(test.crossed_at(p) is not None for p in paths) <= ALPHA * len(paths)  # valid under any stopping
    assert test.crossed_at([-1.0 - 0.01 * (i % 3) for i in range(MAX_N)]) is not None  # a huge, steady gap is found


def test_detectable_gap_is_found_at_the_asked_power():
    sd, n = 0.02, 9
    gap = detectable_gap(sd, n, ALPHA)
    c = student.ppf(1 - ALPHA, n - 1)
    assert nct.sf(c, n - 1, gap * math.sqrt(n) / sd) == pytest.approx(0.8, abs=1e-6)
    assert detectable_gap(sd, 2 * n, ALPHA) < gap < detectable_gap(2 * sd, n, ALPHA)  # more seeds, less noise: smaller
    boundary = spending_boundaries(ALPHA, FIRST, MAX_N)[n - FIRST]
    assert detectable_gap(sd, n, ALPHA, boundary=boundary) > gap  # the sequential boundary is stricter
    assert detectable_gap(sd, 1, ALPHA) is None and detectable_gap(0.0, n, ALPHA) is None


def test_looks_every_second_seed_keep_the_level_and_find_more_gaps_with_few_seeds():
    """A design that looks at the first look, every second seed after it and the last: at its level on null paths,
    and with 4 test seeds (a 5-seed pool) it finds a gap of 2 paired sd more often than one that looks after every
    seed, whose look at 3 seeds spends alpha at a t of 5.7 (2 degrees of freedom) that a real gap seldom reaches."""
    from ilr_search.analysis.sequential import look_schedule

    assert look_schedule(2, 4, 2) == (2, 4) and look_schedule(2, 11, 2) == (2, 4, 6, 8, 10, 11)
    assert look_schedule(2, 11, 1) == tuple(range(2, 12)) and look_schedule(3, 3, 2) == (3,)
    every, second = SequentialTest(ALPHA, 2, 4), SequentialTest(ALPHA, 2, 4, every=2)
    assert second.boundary(4) < every.boundary(4)  # less alpha spent before the last look
    assert second.boundary(3) == second.boundary(2)  # no look at 3: the boundary of the last look before it
    paths = null_paths(SIMULATIONS)
    wide = SequentialTest(ALPHA, FIRST, MAX_N, every=2)
    assert sum(wide.crossed_at(p) is not None for p in paths) <= binomial_ceiling(SIMULATIONS, ALPHA)
    assert {wide.crossed_at(p) for p in paths} <= {None, *wide.looks}  # it claims only where it looks
    shifted = [[x - 2.0 for x in p[:4]] for p in paths]  # the map better by 2 sd: its loss lower
    found_every = sum(every.crossed_at(p) is not None for p in shifted)
    found_second = sum(second.crossed_at(p) is not None for p in shifted)
    assert found_second > found_every
