"""The frozen race's tests paired by unit (analysis/unit_pairs.py): they keep their level on simulated null data,
the exact sign test's boundaries are exact, and a planted gap is found about as often as the stated detectable gap
says."""

import itertools
import math

import numpy as np
import pytest
from scipy.stats import binom

from ilr_search.analysis.sequential import obrien_fleming_spent
from ilr_search.analysis.unit_pairs import (
    UnitPairs,
    UnitTest,
    sign_boundaries,
    unit_detectable_gap,
    unit_pairs,
    z_boundaries,
)

ALPHA, FIRST, CHUNKS, ITEMS = 0.05, 2, 7, 32  # the default frozen race: 7 test chunks, first look after 2
SIMULATIONS = 1000


def binary_pairs(rng, accuracy_base: float, accuracy_map: float, agree: float = 0.8) -> UnitPairs:
    """0/1 losses (1: wrong) of two maps on CHUNKS x ITEMS items; the map copies the baseline's outcome on a share
    `agree` of the items (paired items share their difficulty), else draws its own."""
    base_right = rng.random((CHUNKS, ITEMS)) < accuracy_base
    own = rng.random((CHUNKS, ITEMS)) < accuracy_map
    copy = rng.random((CHUNKS, ITEMS)) < agree if accuracy_map == accuracy_base else np.zeros_like(own)
    map_right = np.where(copy, base_right, own)
    diffs = (1.0 - map_right) - (1.0 - base_right)
    return UnitPairs(tuple(range(CHUNKS)), tuple(tuple(map(float, row)) for row in diffs), True)


def test_the_binary_paired_test_claims_at_most_its_alpha_on_null_items():
    """1,000 simulated null races (both maps right on 60% of the items, agreeing on most): the exact sequential sign
    test claims in at most alpha of them, whatever the looks."""
    rng = np.random.default_rng(20261203)
    test = UnitTest(ALPHA, FIRST, CHUNKS)
    claims = sum(test.crossed_at(binary_pairs(rng, 0.6, 0.6)) is not None for _ in range(SIMULATIONS))
    assert claims / SIMULATIONS <= ALPHA
    assert claims > 0  # it is not a test that never claims: under the null it spends some of its alpha


def test_the_unit_t_test_claims_at_most_its_alpha_on_null_windows():
    rng = np.random.default_rng(7)
    test = UnitTest(ALPHA, FIRST, CHUNKS)
    claims = 0
    for _ in range(SIMULATIONS):
        diffs = rng.standard_normal((CHUNKS, ITEMS)) * 0.05
        claims += test.crossed_at(UnitPairs(tuple(range(CHUNKS)), tuple(map(tuple, diffs)), False)) is not None
    assert claims / SIMULATIONS <= ALPHA


def test_the_sign_boundaries_spend_exactly_what_the_brute_force_walk_spends():
    """Small walks enumerated sign by sign: the probability that the test claims at some look, under the null, is
    the spent alpha the boundaries account for, and never above OBF(alpha) at any look."""
    looks, discordant = (2, 3, 4), (6, 9, 12)
    bounds = sign_boundaries(0.2, looks, 4, discordant)
    claimed = 0.0
    for signs in itertools.product((0, 1), repeat=discordant[-1]):
        for bound, m in zip(bounds, discordant, strict=True):
            if bound is not None and sum(signs[:m]) >= bound:
                claimed += 0.5 ** discordant[-1]
                break
    assert claimed <= obrien_fleming_spent(0.2, 1.0) + 1e-12
    spent_first = binom.sf(bounds[0] - 1, discordant[0], 0.5) if bounds[0] is not None else 0.0
    assert spent_first <= obrien_fleming_spent(0.2, 2 / 4) + 1e-12
    assert claimed > 0


def test_a_gap_in_accuracy_is_found_about_as_often_as_the_detectable_gap_says():
    """Plant a true accuracy gain of the size the test says it detects with 80% power: found in roughly 80% of
    races (between 65% and 92% of 300), and a gap a third of it far less often."""
    rng = np.random.default_rng(11)
    test = UnitTest(ALPHA, FIRST, CHUNKS)
    probe = binary_pairs(rng, 0.5, 0.5 + 0.1)
    gap = unit_detectable_gap(probe, test, 0.8)
    assert gap is not None and 0.03 < gap < 0.3

    def found(gain: float) -> float:
        return sum(test.crossed_at(binary_pairs(rng, 0.5, 0.5 + gain)) is not None for _ in range(300)) / 300

    assert 0.65 <= found(gap) <= 0.92
    assert found(gap / 3) < 0.4


def test_unit_pairs_pair_by_chunk_and_unit():
    a = {1: (0.5, 0.7), 2: (1.0, 0.0), 3: (0.2, 0.2)}
    b = {1: (0.4, 0.9), 2: (1.0, 1.0)}
    pairs = unit_pairs(a, b, [1, 2, 3], binary=False)
    assert pairs.chunks == (1, 2) and pairs.upto(1) == pytest.approx([0.1, -0.2])
    assert pairs.n == 4 and pairs.mean() == pytest.approx((0.1 - 0.2 + 0.0 - 1.0) / 4)
    same = unit_pairs(b, b, [1, 2], binary=True)
    assert same.statistic() == 0.0 and same.p_value() == 1.0
    assert UnitTest(ALPHA, 1, 2).crossed_at(same) is None


def test_z_boundaries_are_obrien_fleming_at_the_last_look():
    bounds = z_boundaries(ALPHA, FIRST, CHUNKS)
    assert len(bounds) == CHUNKS - FIRST + 1 and bounds[0] > bounds[-1]
    assert 1.6 < bounds[-1] < 2.0 and math.isfinite(bounds[-1])  # near z_0.95 = 1.645, a little above it


@pytest.mark.parametrize("binary", [False, True])
def test_the_interval_excludes_zero_exactly_where_the_test_claims(binary):
    """The comparison's interval is the sequential test's repeated confidence interval: at the last look, below 0
    where the test claims a is better there, above 0 where the test run the other way claims, and across 0 else."""
    rng = np.random.default_rng(5)
    test = UnitTest(ALPHA, FIRST, CHUNKS)
    seen = {"better": 0, "worse": 0, "neither": 0}
    for shift in np.linspace(-0.25, 0.25, 41):
        for _ in range(5):
            if binary:
                pairs = binary_pairs(rng, 0.5, 0.5 + shift)
            else:
                pairs = UnitPairs(
                    tuple(range(CHUNKS)),
                    tuple(map(tuple, rng.standard_normal((CHUNKS, ITEMS)) * 0.3 + shift / 2)),
                    False,
                )
            claimed = test.boundary(pairs) is not None and pairs.statistic() >= test.boundary(pairs)
            other = test.boundary(pairs.reversed()) is not None and -pairs.statistic() >= test.boundary(
                pairs.reversed()
            )
            interval = test.interval(pairs)
            if interval is None:
                assert not claimed and not other
                continue
            low, high = interval
            assert (high <= 0) == claimed and (low >= 0) == other, (shift, interval, claimed, other)
            seen["better" if claimed else "worse" if other else "neither"] += 1
    assert all(count > 0 for count in seen.values()), seen
