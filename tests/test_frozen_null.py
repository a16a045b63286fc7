"""The frozen race's window-paired sequential test on simulated null data: 1,000 null races, each run through the
race's own decision code (racing.race_state, as search/race_results.py calls it, with a frozen study's settings)
from its screen to its verdict, with per-window loss differences of mean 0 drawn heavy-tailed (Student t, 3 degrees of
freedom) like real per-window losses. The race may claim the contender better than the baseline in at most alpha of
them, plus binomial slack of two standard errors (sqrt(alpha (1 - alpha) / 1000) each). No training: pure analysis
calls, a fixed numpy seed."""

import math

import numpy as np

from ilr_search.analysis.racing import Evaluation, RaceSettings, race_state
from ilr_search.analysis.stats import decision_level

RACES = 1000
WINDOWS = 16  # windows a chunk: a chunk's loss is the mean of its windows'
MAX_CHUNKS = 8  # chunk 0 scores the trials (the screen), chunks 1..7 test
BASELINE, CONTENDER = "1,1,1,1", "2,2,1,1"
SETTINGS = RaceSettings(
    0,
    0,
    tuple(range(MAX_CHUNKS)),
    race_contenders=2,
    policy="adaptive",
    race_seeds=3,
    race_screen=12,
    equal_compute=False,
    frozen=True,
)


def null_race(rng: np.random.Generator) -> tuple[bool, int]:
    """One null race: per chunk, the baseline's per-window losses (shared text difficulty plus noise) and the
    contender's, the same plus a heavy-tailed difference of mean 0; results are given to the race as it asks for
    them. Returns (whether it claimed the contender, the chunks it tested on)."""
    text = rng.gamma(4.0, 0.5, size=(MAX_CHUNKS, WINDOWS)) + 1.0  # per-window difficulty, right-skewed
    base = text + 0.02 * rng.standard_normal((MAX_CHUNKS, WINDOWS))
    contender = base + 0.05 * rng.standard_t(3, size=(MAX_CHUNKS, WINDOWS))  # mean 0: no true gap
    losses = {BASELINE: base.mean(axis=1), CONTENDER: contender.mean(axis=1)}
    flops = {BASELINE: 1.0, CONTENDER: 1.5}
    have = [Evaluation(k, flops[k], 0, 0, float(losses[k][0])) for k in (BASELINE, CONTENDER)]
    for _ in range(4 * MAX_CHUNKS):
        state = race_state(have, SETTINGS, BASELINE)
        if state.done:
            break
        have += [
            Evaluation(j.map_key, flops[j.map_key], j.steps, j.seed, float(losses[j.map_key][j.seed]))
            for j in state.next_jobs
        ]
    assert state.done
    return CONTENDER in state.confirmed_better, max(e.seed for e in have)


def test_the_window_paired_race_keeps_its_level_on_null_data():
    rng = np.random.default_rng(20261202)
    outcomes = [null_race(rng) for _ in range(RACES)]
    claims = sum(claimed for claimed, _ in outcomes)
    alpha = decision_level(SETTINGS.confidence)
    slack = 2 * math.sqrt(alpha * (1 - alpha) / RACES)  # two binomial standard errors at 1,000 races
    assert claims / RACES <= alpha + slack, (claims, alpha + slack)
    assert any(chunks > 2 for _, chunks in outcomes)  # the race did add chunks while undecided


def test_a_frozen_verdict_speaks_of_windows_not_steps():
    rng = np.random.default_rng(0)
    text = rng.gamma(4.0, 0.5, size=(MAX_CHUNKS, WINDOWS)) + 1.0
    losses = {
        BASELINE: text.mean(axis=1),
        CONTENDER: (text - 0.2).mean(axis=1) + 0.01 * rng.standard_normal(MAX_CHUNKS),
    }  # a clear gap
    have = [
        Evaluation(k, 1.0 if k == BASELINE else 1.5, 0, s, float(losses[k][s]))
        for k in losses
        for s in range(MAX_CHUNKS)
    ]
    state = race_state(have, SETTINGS, BASELINE)
    assert state.done and state.confirmed_better == (CONTENDER,)
    assert "window chunk" in state.verdict and "on held-out windows" in state.verdict
    assert "steps" not in state.verdict and " seed" not in state.verdict, state.verdict
    assert state.equal_compute is None
