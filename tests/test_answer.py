"""The answer line and its details, from race states built by hand (no training): a claimed win, a null result,
an open race, and a futility stop, which is never called `worse`."""

import dataclasses
import math
import re

from ilr_search.analysis.answer import Trust, race_answer, side, unraced_answer
from ilr_search.analysis.race_core import (
    CANNOT_WIN,
    Comparison,
    DetectableGap,
    FrontPoint,
    RaceJob,
    RaceSettings,
    RaceState,
)

BASE = "1,1,1,1"
SETTINGS = RaceSettings(100, 400, seeds=tuple(range(6)), race_contenders=6)
GAP = DetectableGap(nats=0.02, ppl=0.21, power=0.8, seeds=5, sd_diff=0.01, level=0.05)
SIGNED = re.compile(r"(?<![\w.])[+-]\d")  # a number with a bare sign


def comparison(key: str, mean_diff: float, status: str, n: int = 5, width: float = 0.003) -> Comparison:
    return Comparison(
        key,
        1.25,
        tuple(range(1, n + 1)),
        mean_diff,
        0.004,
        (mean_diff - width, mean_diff + width),
        0.01,
        -mean_diff / 0.002,
        0.05,
        2.0,
        status,
        3 if status == "better" else None,
    )


def point(key: str, ppl: float, n: int = 6, confirmed: bool = False) -> FrontPoint:
    return FrontPoint(key, 1.0 if key == BASE else 1.25, 400, tuple(range(n)), ppl, (ppl - 0.1, ppl + 0.1), confirmed)


def test_a_claimed_win_says_use_the_map_with_its_gain_interval_seeds_and_steps():
    state = RaceState(
        alive=(BASE, "2,1,1,1"),
        done=True,
        level_steps=400,
        best="2,1,1,1",
        confirmed_better=("2,1,1,1",),
        front=(point(BASE, 10.0), point("2,1,1,1", 9.9, confirmed=True)),
        comparisons=(comparison("2,1,1,1", -0.01, "better"), comparison("1,2,1,1", 0.004, CANNOT_WIN)),
        compute_steps=4800,
        detectable_gap=GAP,
        stopped="every comparison decided",
    )
    answer = race_answer(state, SETTINGS, BASE, 10.0)
    gain = 10.0 * (1 - math.exp(-0.01))
    low, high = 10.0 * (1 - math.exp(-0.007)), 10.0 * (1 - math.exp(-0.013))
    assert answer.line == (
        f"use 2,1,1,1: {gain:.2f} ppl better than the plain model (90% interval {low:.2f} to "
        f"{high:.2f}), 6 seeds at 400 steps"
    )
    assert answer.claims and answer.decided
    details = "\n".join(answer.details)
    assert f"closest contender: 1,2,1,1 worse by {10.0 * (math.exp(0.004) - 1):.2f} ppl than the plain model" in details
    assert "status: cannot win" in details
    assert (
        "seeds at 400 steps: the plain model 6 seeds; 2,1,1,1 6 seeds (5 of them tested against the plain model)"
        in details
    )  # the front's and the race table's counts, with the test seeds said apart
    assert "steps: 400 a run at the target (the search's proxy trained 100); the race trained 4800 in all" in details
    assert "stopped because every comparison decided" in details
    assert not SIGNED.search(answer.line + details)


def test_a_null_result_says_no_map_beat_and_the_gap_it_would_have_seen():
    state = RaceState(
        alive=(BASE, "2,1,1,1"),
        done=True,
        level_steps=400,
        best=BASE,
        front=(point(BASE, 10.0), point("2,1,1,1", 9.98)),
        comparisons=(comparison("2,1,1,1", -0.002, "undecided", width=0.01), comparison("1,2,1,1", 0.03, CANNOT_WIN)),
        compute_steps=6000,
        detectable_gap=GAP,
        stopped="the pool's 5 test seeds were spent",
    )
    answer = race_answer(state, SETTINGS, BASE, 10.0, trust=Trust(-0.21, 6, 100, 400))
    assert answer.line == (
        "no map beat the plain model at 400 steps; a gap of 0.21 ppl or more would have been seen (80% power)"
    )
    assert not answer.claims and answer.decided
    closest = answer.details[0]
    assert closest.startswith(
        "closest contender: 2,1,1,1 better by 0.02 ppl than the plain model (90% interval "
        "from 0.08 worse to 0.12 better)"
    )
    assert answer.trust is not None and answer.trust.text() == (
        "the 100-step search ranked maps unlike 400-step training (Spearman -0.21 over 6 maps): its order is a weak "
        "guide"
    )
    assert not SIGNED.search(answer.line + "\n".join(answer.details))


def test_an_open_race_says_no_decision_yet_and_what_is_left():
    state = RaceState(
        alive=(BASE, "2,1,1,1", "1,2,1,1"),
        done=False,
        level_steps=400,
        next_jobs=(RaceJob(BASE, 400, 3), RaceJob("2,1,1,1", 400, 3)),
        front=(point(BASE, 10.0, 3), point("2,1,1,1", 9.95, 3)),
        comparisons=(comparison("2,1,1,1", -0.005, "open", 2), comparison("1,2,1,1", 0.03, CANNOT_WIN, 2)),
    )
    answer = race_answer(state, SETTINGS, BASE, 10.0)
    assert answer.line == (
        "no decision yet: 1 of 2 comparisons with the plain model still open at 400 steps, 2 runs "
        "to train next; run the same command again to go on"
    )
    assert not answer.decided and not any(d.startswith("stopped because") for d in answer.details)
    waiting = RaceState(alive=(), next_jobs=(RaceJob(BASE, 100, 0),), level_steps=100)
    assert race_answer(waiting, SETTINGS, BASE, None).line == (
        "no decision yet: the race has not started at 100 steps, 1 run to train next; "
        "run the same command again to go on"
    )


def test_the_replicate_unit_is_data_and_signs_are_words():
    state = RaceState(
        alive=(BASE, "2,1,1,1"),
        done=True,
        level_steps=400,
        best="2,1,1,1",
        confirmed_better=("2,1,1,1",),
        front=(point(BASE, 10.0, 4), point("2,1,1,1", 9.9, 4, True)),
        comparisons=(comparison("2,1,1,1", -0.01, "better", 3),),
    )
    line = race_answer(state, dataclasses.replace(SETTINGS, frozen=True), BASE, 10.0).line
    assert line.endswith(", 4 window chunks on held-out windows") and "seed" not in line
    assert side(0.0312, "X") == "better by 0.03 ppl than X" and side(-0.5, "X") == "worse by 0.50 ppl than X"
    assert side(0.001, "the plain model") == "level with the plain model"  # no "than" after "level with"
    assert unraced_answer("the race is off", 32).line.startswith("no map beat the plain model by a test at 32 steps")
