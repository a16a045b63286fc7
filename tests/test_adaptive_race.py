"""The adaptive race (analysis/adaptive_race.py) on hand-made results whose answers are known: judged at the
target, seeds bought only while a comparison is open, the screen's seed kept out of the tests, a crossing map
taken to the target, the base length eliminating only where the screen shows the lengths rank alike, the compute
cap, the equal-compute reference, and whole verdict sentences."""

import math
import random
from collections.abc import Callable

import pytest

from ilr_search.analysis.answer import race_answer
from ilr_search.analysis.racing import Evaluation, RaceSettings, RaceState, race_state

BASE = "1,1,1,1"
SETTINGS = RaceSettings(100, 400, seeds=tuple(range(8)), race_contenders=3, race_screen=8)
Loss = Callable[[str, int, int], float | None]


def flops_of(key: str) -> float:
    return 1.0 + (sum(int(x) for x in key.split(",")) - 4) / 4 if not key.startswith("deep") else int(key[4:]) / 4


def run(
    loss: Loss, maps: list[str], settings: RaceSettings = SETTINGS, max_rounds: int = 100
) -> tuple[list[list[tuple[str, int, int]]], list[Evaluation], RaceState]:
    """Every map's base result at seeds[0], then the policy's waves answered by `loss` until it is done."""
    evaluations = [
        Evaluation(
            k, flops_of(k), settings.base_steps, settings.seeds[0], loss(k, settings.base_steps, settings.seeds[0])
        )
        for k in maps
    ]
    waves = []
    for _ in range(max_rounds):
        state = race_state(evaluations, settings, BASE)
        if state.done:
            return waves, evaluations, state
        waves.append([(j.map_key, j.steps, j.seed) for j in state.next_jobs])
        evaluations += [
            Evaluation(j.map_key, flops_of(j.map_key), j.steps, j.seed, loss(j.map_key, j.steps, j.seed))
            for j in state.next_jobs
        ]
    raise AssertionError("the race did not finish")


def noisy(gaps: dict[str, float], sd: float = 0.02, base_gaps: dict[str, float] | None = None, seed: int = 0) -> Loss:
    """Losses: the baseline's curve, each map `gaps[map]` nats off it at the target (`base_gaps` at the base
    length, the same gap where not given), and per (map, steps, seed) noise of sd `sd`."""
    rng = random.Random(seed)
    noise: dict[tuple[str, int, int], float] = {}

    def loss(key: str, steps: int, s: int) -> float:
        gap = gaps.get(key, 0.0) if steps > 100 or base_gaps is None else base_gaps.get(key, gaps.get(key, 0.0))
        if (key, steps, s) not in noise:
            noise[(key, steps, s)] = rng.gauss(0, sd)
        return 2.5 - 0.2 * math.log2(steps / 100) + gap + noise[(key, steps, s)]

    return loss


def seeds_of(evaluations: list[Evaluation], key: str, steps: int = 400) -> set[int]:
    return {e.seed for e in evaluations if e.map_key == key and e.steps == steps}


def test_a_large_gap_is_claimed_early_and_a_map_that_cannot_win_stops_early():
    waves, evaluations, state = run(noisy({"2,1,1,1": -0.3, "1,2,1,1": 0.3}, sd=0.01), [BASE, "2,1,1,1", "1,2,1,1"])
    assert state.done and state.confirmed_better == ("2,1,1,1",) and state.best == "2,1,1,1"
    comparisons = {c.map_key: c for c in state.comparisons}
    assert comparisons["2,1,1,1"].status == "better" and comparisons["1,2,1,1"].status == "cannot win"
    assert len(seeds_of(evaluations, "2,1,1,1")) < len(SETTINGS.seeds)  # decided before the pool was spent
    assert len(seeds_of(evaluations, "1,2,1,1")) < len(SETTINGS.seeds)
    assert "1,2,1,1" in state.eliminated and state.eliminated["1,2,1,1"].startswith("stopped: cannot win")
    assert "worse" not in state.eliminated["1,2,1,1"]  # the futility rule is no test that it is worse
    assert not any(steps not in (100, 400) for wave in waves for _, steps, _ in wave)  # judged at the target only
    front = {p.map_key: p for p in state.front}
    assert front["2,1,1,1"].confirmed and not front[BASE].confirmed  # the baseline is the reference
    c = comparisons["2,1,1,1"]
    base_ppl = front[BASE].val_ppl
    gain = base_ppl * (1 - math.exp(c.mean_diff))  # the paired difference as ppl, as the answer line says it
    low, high = base_ppl * (1 - math.exp(c.interval[1])), base_ppl * (1 - math.exp(c.interval[0]))
    assert low > 0
    assert state.verdict == (
        f"recurrence beats the baseline at 400 steps (90% confidence, sequential paired tests on seeds after the "
        f"screen's, Holm over 2 map(s)): 2,1,1,1 better by {gain:.2f} ppl than the baseline (90% interval "
        f"{low:.2f} to {high:.2f}, p={c.p_value:.3g}, {c.n} test seeds); "
        f"gaps of {state.detectable_gap.ppl:.2f} ppl or more would have been seen with 80% power "
        f"({state.detectable_gap.seeds} test seeds); the race trained {state.compute_steps} steps; it stopped "
        f"because every comparison decided"
    )


def test_nothing_distinguishable_says_the_gap_it_would_have_seen():
    waves, evaluations, state = run(
        noisy({"2,1,1,1": 0.0, "1,2,1,1": 0.0}, sd=0.02, seed=3), [BASE, "2,1,1,1", "1,2,1,1"]
    )
    assert state.done and state.confirmed_better == () and state.best == BASE
    gap = state.detectable_gap
    assert gap is not None and gap.nats > 0 and gap.ppl > 0 and gap.power == 0.8
    assert state.verdict.startswith("nothing here is distinguishable from the baseline at 400 steps with ")
    assert "test seeds (90% confidence); gaps of " in state.verdict
    assert (
        f"gaps of {gap.ppl:.2f} ppl or more would have been seen with 80% power ({gap.seeds} test seeds)"
    ) in state.verdict
    assert "closest " in state.verdict and "would show" in state.verdict and "beats" in state.verdict
    assert "better by" in state.verdict or "worse by" in state.verdict or "level with" in state.verdict
    assert state.verdict.endswith(f"the race trained {state.compute_steps} steps; it stopped because {state.stopped}")


def test_the_screen_seed_chooses_the_contenders_and_the_tests_never_see_it():
    waves, evaluations, state = run(noisy({"2,1,1,1": -0.3}, sd=0.01), [BASE, "2,1,1,1"])
    for c in state.comparisons:
        assert SETTINGS.seeds[0] not in c.seeds
    assert waves[0] == [(BASE, 400, 0), ("2,1,1,1", 400, 0)]  # the screen: every map at the target at seed 0


def test_a_crossing_map_is_taken_to_the_target_and_claimed():
    """2,2,1,1 is the worst map at the base length and the best at the target (the other maps cross too, so the
    screen does not show the lengths ranking alike): it is screened, raced and claimed, never eliminated before."""
    maps = [BASE, "2,1,1,1", "1,2,1,1", "1,1,2,1", "2,2,1,1"]
    loss = noisy(
        {"2,1,1,1": 0.1, "1,2,1,1": 0.05, "1,1,2,1": 0.08, "2,2,1,1": -0.3},
        sd=0.01,
        base_gaps={"2,1,1,1": -0.05, "1,2,1,1": -0.03, "1,1,2,1": 0.02, "2,2,1,1": 0.2},
    )
    waves, evaluations, state = run(loss, maps)
    assert "2,2,1,1" not in state.eliminated and "2,2,1,1" in state.confirmed_better
    assert len(seeds_of(evaluations, "2,2,1,1")) >= SETTINGS.race_seeds
    assert state.screen.agreement.spearman < SETTINGS.min_agreement
    shown = state.screen.to_dict()  # the JSON's `screen`, as before it was a record
    assert list(shown) == ["maps", "screened", "agreement", "base_losses", "target_losses"]
    assert list(shown["agreement"]) == ["maps", "spearman", "margin"] and shown["screened"] == sorted(maps)
    assert shown["target_losses"] == {k: state.screen.target_losses[k] for k in maps}


def test_the_base_length_eliminates_only_where_the_screen_shows_the_lengths_rank_alike():
    maps = [BASE] + [f"{a},{b},1,1" for a in (1, 2, 3) for b in (1, 2, 3) if (a, b) != (1, 1)][:7]
    alike = {k: 0.05 * i for i, k in enumerate(maps)}  # the same order, the same gaps, at both lengths
    waves, evaluations, state = run(noisy(alike, sd=0.001), maps)
    skipped = [k for k in maps if not seeds_of(evaluations, k)]
    assert skipped and all("rank alike" in state.eliminated[k] for k in skipped)
    assert len(waves[0]) == SETTINGS.calibration  # the first screen wave measured the agreement
    crossing = {k: (0.05 * i if i % 2 else -0.05 * i) for i, k in enumerate(maps)}
    flipped = {k: -v for k, v in crossing.items()}
    waves, evaluations, state = run(noisy(crossing, sd=0.001, base_gaps=flipped), maps)
    assert all(seeds_of(evaluations, k) for k in maps)  # the lengths disagree: every map goes to the target


def test_the_compute_cap_stops_the_race_and_the_verdict_says_so():
    settings = RaceSettings(100, 400, seeds=tuple(range(8)), race_contenders=3, race_screen=8, max_steps=3000)

    def undecided(key: str, steps: int, seed: int) -> float:  # a small lead, far inside its seeds' spread
        return 2.0 + (0.0 if key == BASE else -0.005 + 0.05 * (-1) ** seed)

    waves, evaluations, state = run(undecided, [BASE, "2,1,1,1"], settings)
    assert state.done and state.compute_steps <= 3000 and "compute cap (3000 steps)" in state.stopped
    assert "it stopped because the compute cap (3000 steps) was reached" in state.verdict
    assert any(c.status == "capped" for c in state.comparisons)


def test_the_equal_compute_reference_trains_at_the_best_contenders_seeds():
    settings = RaceSettings(
        100, 400, seeds=tuple(range(6)), race_contenders=3, race_screen=8, equal_compute=True, layer_param_share=0.2
    )
    waves, evaluations, state = run(
        noisy({"2,1,1,1": -0.3, "2,2,1,1": 0.2, "deep5": -0.1}, sd=0.01), [BASE, "2,1,1,1", "2,2,1,1"], settings
    )
    deep = [w for w in waves if any(k == "deep5" for k, _, _ in w)]
    assert len(deep) == 1 and all(k == "deep5" for k, _, _ in deep[0])  # one wave, after the contenders decided
    assert seeds_of(evaluations, "deep5") == seeds_of(evaluations, "2,1,1,1")
    equal = state.equal_compute
    assert equal.deep_key == "deep5" and equal.layers == 5 and equal.map == "2,1,1,1"
    assert equal.params_ratio == pytest.approx(1.2)
    d = equal.map_minus_deep
    assert d.mean_diff == pytest.approx(-0.2, abs=0.03)
    assert d.ppl_diff == pytest.approx(d.deep_ppl * (math.exp(d.mean_diff) - 1))  # paired, as ppl
    assert (
        f"2,1,1,1 better by {-d.ppl_diff:.2f} ppl than deep5, a plain 5-layer model of the same compute, "
        "1.20x the parameters (90% interval "
    ) in state.verdict
    details = race_answer(state, settings, BASE, 10.0).details  # the answer's list says the same, in the same words
    assert any(
        line.startswith(
            f"equal compute: 2,1,1,1 better by {-d.ppl_diff:.2f} ppl than a plain 5-layer model "
            "of the same compute (deep5, 1.20x the parameters; 90% interval "
        )
        for line in details
    )
    assert "deep5" not in {c.map_key for c in state.comparisons}  # a reference, not a contender


def test_the_same_evaluations_in_any_order_give_the_same_decision():
    waves, evaluations, state = run(
        noisy({"2,1,1,1": -0.02, "1,2,1,1": 0.01}, sd=0.02, seed=9), [BASE, "2,1,1,1", "1,2,1,1"]
    )
    shuffled = list(evaluations)
    random.Random(1).shuffle(shuffled)
    assert race_state(shuffled, SETTINGS, BASE) == state


def test_after_the_first_test_each_wave_adds_look_every_seeds():
    """With look_every 2 an open comparison gets two seeds a wave after its first test (where its test looks next),
    the pool's last one alone; with 1, one a wave."""
    loss = noisy({"2,1,1,1": 0.0, "1,2,1,1": 0.0}, sd=0.02, seed=3)
    for every, sizes in ((1, {1}), (2, {2, 1})):
        settings = RaceSettings(100, 400, seeds=tuple(range(8)), race_contenders=3, race_screen=8, look_every=every)
        waves, evaluations, state = run(loss, [BASE, "2,1,1,1", "1,2,1,1"], settings)
        test_waves = [w for w in waves if w and all(steps == 400 and seed > 2 for _, steps, seed in w)]
        added = {len({seed for key, _, seed in w if key == key0}) for w in test_waves for key0 in {w[-1][0]}}
        assert test_waves and added <= sizes and max(added) == max(sizes)
        assert state.done


def test_automatic_looks_are_every_second_seed_only_where_test_seeds_are_few():
    """look_every 0 (the default): a pool of 4 test seeds gets its last two in one wave, a pool of 7 one a wave."""
    from ilr_search.analysis.sequential import looks_apart

    assert [looks_apart(0, n) for n in (2, 4, 5, 7, 11)] == [2, 2, 1, 1, 1] and looks_apart(3, 4) == 3
    loss = noisy({"2,1,1,1": 0.0, "1,2,1,1": 0.0}, sd=0.02, seed=3)
    for pool, added in ((5, {2}), (8, {1})):
        settings = RaceSettings(100, 400, seeds=tuple(range(pool)), race_contenders=3, race_screen=8)
        waves, _, state = run(loss, [BASE, "2,1,1,1", "1,2,1,1"], settings)
        later = [w for w in waves if w and all(steps == 400 and seed > 2 for _, steps, seed in w)]
        assert state.done and later
        assert {len({seed for key, _, seed in w if key == BASE}) for w in later[:1]} == added


def run_as_results_arrive(loss: Loss, maps: list[str], order: int) -> tuple[set[tuple[str, int, int]], RaceState]:
    """The race as workers meet it: every run the policy asks for starts at once, and they finish one at a time
    in an order drawn from `order`, the policy asked again after each; what was trained, and the final state."""
    evaluations = [Evaluation(k, flops_of(k), 100, 0, loss(k, 100, 0)) for k in maps]
    trained: set[tuple[str, int, int]] = set()
    running: list[tuple[str, int, int]] = []
    rng = random.Random(order)
    while True:
        state = race_state(evaluations, SETTINGS, BASE)
        for j in state.next_jobs:
            if (j.map_key, j.steps, j.seed) not in trained:
                trained.add((j.map_key, j.steps, j.seed))
                running.append((j.map_key, j.steps, j.seed))
        if not running:
            return trained, state
        key, steps, seed = running.pop(rng.randrange(len(running)))
        evaluations.append(Evaluation(key, flops_of(key), steps, seed, loss(key, steps, seed)))


@pytest.mark.parametrize("gaps", [{"2,1,1,1": 0.0, "1,2,1,1": 0.01}, {"2,1,1,1": -0.015, "1,2,1,1": 0.004}])
def test_the_order_runs_finish_in_changes_neither_what_is_trained_nor_the_decision(gaps):
    """A contender's run that finishes before the baseline's at the same seed buys it no further seed: its
    comparison looks only at seeds both have, so the race trains what the wave-by-wave replay trains (the one
    benchmarks/power.py and the power figures measure) and decides the same, whatever the workers' timing."""
    loss = noisy(gaps, sd=0.02, seed=5)
    maps = [BASE, "2,1,1,1", "1,2,1,1"]
    waves, _, replayed = run(loss, maps)
    in_waves = {job for wave in waves for job in wave}
    for order in range(12):
        trained, state = run_as_results_arrive(loss, maps, order)
        assert trained == in_waves, order
        assert state == replayed


def test_a_comparison_at_its_look_waits_for_the_others_to_reach_theirs():
    """The comparisons share the family's level (a claim passes its share on), so a contender whose wave is in (with
    the baseline's) asks for nothing more until every open contender's is: nothing beyond the wave under way."""
    loss = noisy({"2,1,1,1": 0.0, "1,2,1,1": 0.0}, sd=0.02, seed=3)
    maps = [BASE, "2,1,1,1", "1,2,1,1"]
    evaluations = [Evaluation(k, flops_of(k), 100, 0, loss(k, 100, 0)) for k in maps]
    while True:  # answer whole waves until the tests are under way
        state = race_state(evaluations, SETTINGS, BASE)
        tested = {k: seeds_of(evaluations, k) - {0} for k in maps[1:]}
        if all(len(s) >= 3 for s in tested.values()) or state.done:
            break
        evaluations += [
            Evaluation(j.map_key, flops_of(j.map_key), j.steps, j.seed, loss(j.map_key, j.steps, j.seed))
            for j in state.next_jobs
        ]
    assert not state.done
    wave = state.next_jobs
    ahead = [j for j in wave if j.map_key != "1,2,1,1"]  # the baseline's and one contender's runs finish first
    assert ahead and len(ahead) < len(wave)
    partial = evaluations + [
        Evaluation(j.map_key, flops_of(j.map_key), j.steps, j.seed, loss(j.map_key, j.steps, j.seed)) for j in ahead
    ]
    later = race_state(partial, SETTINGS, BASE).next_jobs
    assert {j.seed for j in later} <= {j.seed for j in wave}, later
