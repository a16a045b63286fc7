"""The race: seed statistics (stats.py), the racing policy (racing.py) and its replay over a truth table
(benchmarks/replays/policy.py), on hand-made results whose answers are known."""

import json
import math
import random
from collections.abc import Callable

import pytest
from conftest import ROOT, write_truth
from replays.policy import race_template, replay_policy, replay_race
from replays.truth import TruthTable
from scipy import stats as sps

from ilr_search.analysis.racing import Evaluation, RaceJob, RaceSettings, race_lengths, race_state
from ilr_search.analysis.stats import paired_comparison, seed_interval
from ilr_search.errors import UserInputError

BASE = "1,1,1,1"


# ----------------------------------------------------------------------------------------------------
# Statistics


def test_paired_comparison_matches_a_hand_computation_and_ttest_rel():
    a = {0: 1.00, 1: 1.10, 2: 0.95, 7: 3.0}  # seed 7 has no partner: left out
    b = {0: 1.05, 1: 1.20, 2: 1.00, 9: 0.0}
    c = paired_comparison(a, b, confidence=0.9)
    # differences -0.05, -0.10, -0.05: mean -1/15, sd 0.05/sqrt(3), t = mean / (sd / sqrt(3)) = -4 exactly
    assert c.seeds == (0, 1, 2)
    assert c.mean_diff == pytest.approx(-1 / 15)
    assert c.sd_diff == pytest.approx(0.05 / math.sqrt(3))
    # Student t with 2 dof has the closed-form cdf 1/2 + t / (2 sqrt(2 + t^2)): at t = -4, 1/2 - 4 / (2 sqrt(18))
    assert c.p_value == pytest.approx(0.5 - 4 / (2 * math.sqrt(18)))
    assert c.p_value == pytest.approx(sps.ttest_rel([1.00, 1.10, 0.95], [1.05, 1.20, 1.00], alternative="less").pvalue)
    # two-sided 90% interval: mean +- t_{0.95, 2} sd / sqrt(3), where t_{0.95, 2} = sqrt(2) * 0.9 / sqrt(1 - 0.81)
    t95 = math.sqrt(2) * 0.9 / math.sqrt(1 - 0.81)  # the inverse of the closed-form cdf at 0.95
    half = t95 * (0.05 / math.sqrt(3)) / math.sqrt(3)
    assert c.interval == pytest.approx((-1 / 15 - half, -1 / 15 + half))
    assert c.interval[1] < 0 and c.a_better  # the interval excludes zero: a is better
    reverse = paired_comparison(b, a, confidence=0.9)
    assert reverse.mean_diff == pytest.approx(1 / 15) and not reverse.a_better


def test_the_t_test_gives_scipys_numbers_to_the_bit():
    """stats.t_test computes what scipy.stats.ttest_1samp and ttest_rel do, without their wrapper: equal to the
    last bit on random losses of 2 to 13 seeds, near-equal pairs (a shared seed's small differences) included."""
    import numpy as np

    rng = np.random.default_rng(0)
    for i in range(300):
        n = int(rng.integers(2, 14))
        xs = list(rng.normal(1.5, 0.05, n))
        ys = [x + rng.normal(0, 1e-3) for x in xs] if i % 3 == 0 else list(rng.normal(1.5, 0.05, n))
        confidence = (0.8, 0.9, 0.95, 0.975)[i % 4]
        c = paired_comparison(dict(enumerate(xs)), dict(enumerate(ys)), confidence)
        ci = sps.ttest_rel(xs, ys).confidence_interval(confidence)
        p = sps.ttest_rel(xs, ys, alternative="less").pvalue
        assert (c.p_value, c.interval) == (float(p), (float(ci.low), float(ci.high)))
        one = sps.ttest_1samp(xs, 0.0).confidence_interval(confidence)
        assert seed_interval(xs, confidence).interval_loss == (float(one.low), float(one.high))


def test_paired_decision_needs_two_common_seeds_and_an_interval_clear_of_zero():
    assert not paired_comparison({0: 1.0}, {0: 9.0}, 0.9).a_better  # one seed: no spread, no decision
    assert paired_comparison({0: 1.0}, {0: 9.0}, 0.9).interval is None
    # an interval that straddles zero never decides, whatever the mean says
    straddles = paired_comparison({0: 1.0, 1: 1.2}, {0: 1.1, 1: 1.15}, 0.9)
    assert straddles.interval[0] < 0 < straddles.interval[1] and not straddles.a_better
    assert straddles.p_value == pytest.approx(sps.ttest_rel([1.0, 1.2], [1.1, 1.15], alternative="less").pvalue)


def test_seed_interval_is_a_t_interval_and_none_with_one_seed():
    one = seed_interval([2.0], 0.9)
    assert one.n == 1 and one.interval_loss is None and one.interval_ppl is None and one.sd_loss is None
    two = seed_interval([2.0, 2.2], 0.9)
    t95_1dof = math.tan(math.pi * (0.95 - 0.5))  # Student t with 1 dof is Cauchy
    half = t95_1dof * two.sd_loss / math.sqrt(2)
    assert two.mean_loss == pytest.approx(2.1) and two.sd_loss == pytest.approx(0.2 / math.sqrt(2))
    assert two.interval_loss == pytest.approx((2.1 - half, 2.1 + half))
    assert two.interval_ppl == pytest.approx((math.exp(2.1 - half), math.exp(2.1 + half)))
    assert two.val_ppl == pytest.approx(math.exp(2.1))


def test_seeds_needed_clears_the_interval_at_that_many_seeds():
    c = paired_comparison({0: 1.0, 1: 1.1, 2: 0.9}, {0: 1.02, 1: 1.09, 2: 0.95}, 0.9)
    assert not c.a_better
    n = c.seeds_needed()
    assert n is not None and n > 3
    t = sps.t.ppf(0.95, n - 1)
    assert t * c.sd_diff / math.sqrt(n) < abs(c.mean_diff) <= sps.t.ppf(0.95, n - 2) * c.sd_diff / math.sqrt(n - 1)


# ----------------------------------------------------------------------------------------------------
# The policy

Loss = Callable[[str, int, int], float | None]


def run_race(
    loss: Loss, flops: dict[str, float], settings: RaceSettings, max_rounds: int = 100
) -> tuple[list[list[RaceJob]], list[Evaluation], object]:
    """Every map's base result at the first seed, then the policy's waves answered by `loss` until done."""
    evaluations = [
        Evaluation(k, f, settings.base_steps, settings.seeds[0], loss(k, settings.base_steps, settings.seeds[0]))
        for k, f in flops.items()
    ]
    waves = []
    for _ in range(max_rounds):
        state = race_state(evaluations, settings, BASE)
        if state.done:
            return waves, evaluations, state
        waves.append(list(state.next_jobs))
        evaluations += [
            Evaluation(j.map_key, flops[j.map_key], j.steps, j.seed, loss(j.map_key, j.steps, j.seed))
            for j in state.next_jobs
        ]
    raise AssertionError("the race did not finish")


def test_lengths_double_up_to_the_target():
    assert race_lengths(RaceSettings(100, 400)) == (100, 200, 400)
    assert race_lengths(RaceSettings(100, 300)) == (100, 200, 300)
    assert race_lengths(RaceSettings(100, 100)) == (100,)
    with pytest.raises(ValueError):
        race_lengths(RaceSettings(100, 50))


def test_a_map_dominated_at_two_seeds_is_eliminated_and_a_tied_one_kept():
    flops = {BASE: 1.0, "3,1,1,1": 1.5, "2,1,1,1": 1.25}
    noise = {0: 0.0, 1: 0.03, 2: -0.02}

    def loss(key: str, steps: int, seed: int) -> float:
        if key == "3,1,1,1":
            return 2.5 + noise[seed]  # far worse than the baseline, by the same amount at every seed
        if key == "2,1,1,1":
            return 2.0 + (0.05 if seed % 2 else -0.05)  # the baseline's mean, with a large alternating spread
        return 2.0 + noise[seed] * 0.1

    settings = RaceSettings(100, 400, policy="fixed", seeds=(0, 1, 2), race_contenders=6)
    waves, evaluations, state = run_race(loss, flops, settings)
    assert "3,1,1,1" in state.eliminated and state.eliminated["3,1,1,1"].startswith(
        f"{BASE} better than 3,1,1,1 at 100"
    )
    assert "seeds 0,1" in state.eliminated["3,1,1,1"]  # decided at two seeds: its third seed was never trained
    assert not any(e.map_key == "3,1,1,1" and (e.seed == 2 or e.steps > 100) for e in evaluations)
    assert "2,1,1,1" in state.alive and BASE in state.alive
    assert {e.steps for e in evaluations if e.map_key == "2,1,1,1"} == {100, 200, 400}
    assert state.done and state.level_steps == 400


def test_promotion_in_order_seeds_before_length_and_lengths_in_order():
    flops = {BASE: 1.0, "2,1,1,1": 1.25, "1,2,1,1": 1.25, "1,1,2,1": 1.25}
    rng = random.Random(3)
    table = {(k, s, seed): 2.0 + rng.gauss(0, 0.05) for k in flops for s in (100, 200, 400) for seed in (0, 1, 2)}
    waves, evaluations, state = run_race(
        lambda k, s, seed: table[(k, s, seed)], flops, RaceSettings(100, 400, policy="fixed", race_contenders=6)
    )
    order = [(j.steps, j.seed) for wave in waves for j in wave]
    assert order == sorted(order)  # lengths in order, and within a length seeds in order
    for wave in waves:
        assert len({(j.steps, j.seed) for j in wave}) == 1  # a wave is one seed at one length
    # every map alive at a length had all its seeds there before any job at the next length
    for i, wave in enumerate(waves):
        earlier = {(j.map_key, j.steps, j.seed) for w in waves[:i] for j in w} | {(k, 100, 0) for k in flops}
        steps = wave[0].steps
        if steps > 100:
            previous = steps // 2
            for j in wave:
                assert all((j.map_key, previous, seed) in earlier for seed in (0, 1, 2))
    assert len(set((e.map_key, e.steps, e.seed) for e in evaluations)) == len(evaluations)  # nothing trained twice
    assert state.done


def test_the_fixed_race_stops_at_the_compute_cap_and_says_so():
    """`--max-race-steps` caps the fixed race too: no wave that would train beyond the cap starts, and the verdict
    says why the race stopped; without the cap the same race trains on to the target."""
    flops = {BASE: 1.0, "2,1,1,1": 1.25, "1,2,1,1": 1.25}
    rng = random.Random(5)
    table = {(k, s, seed): 2.0 + rng.gauss(0, 0.05) for k in flops for s in (100, 200, 400) for seed in (0, 1, 2)}

    def loss(k: str, s: int, seed: int) -> float:
        return table[(k, s, seed)]

    free = run_race(loss, flops, RaceSettings(100, 400, policy="fixed", race_contenders=6))[2]
    assert free.compute_steps > 1000 and not free.stopped
    waves, evaluations, state = run_race(
        loss, flops, RaceSettings(100, 400, policy="fixed", race_contenders=6, max_steps=1000)
    )
    assert state.done and state.compute_steps <= 1000 < free.compute_steps
    assert state.stopped == "the compute cap (1000 steps) was reached" and state.stopped in state.verdict


def test_contenders_are_the_base_front_capped_with_the_baseline_always():
    flops = {BASE: 1.0, "2,1,1,1": 1.25, "1,2,1,1": 1.25, "2,2,1,1": 1.5, "3,1,1,1": 1.5, "3,3,1,1": 2.0}
    base = {BASE: 2.3, "2,1,1,1": 2.0, "1,2,1,1": 2.1, "2,2,1,1": 1.9, "3,1,1,1": 2.2, "3,3,1,1": 1.95}
    evaluations = [Evaluation(k, f, 100, 0, base[k]) for k, f in flops.items()]
    state = race_state(evaluations, RaceSettings(100, 400, policy="fixed", race_contenders=3), BASE)
    # the front in (loss, flops) is 1,1,1,1 (cheapest), 2,1,1,1 and 2,2,1,1; the baseline takes one of the 3 places
    assert set(state.alive) == {BASE, "2,1,1,1", "2,2,1,1"}
    assert set(state.not_raced) == {"1,2,1,1", "3,1,1,1", "3,3,1,1"}
    assert {j.map_key for j in state.next_jobs} == set(state.alive) and {j.seed for j in state.next_jobs} == {1}
    again = race_state(list(reversed(evaluations)), RaceSettings(100, 400, policy="fixed", race_contenders=3), BASE)
    assert again == state  # the same evaluations in any order: the same decision


def test_missing_base_results_come_first_and_a_diverged_map_is_eliminated():
    settings = RaceSettings(100, 400, policy="fixed", race_contenders=6)
    state = race_state([Evaluation("2,1,1,1", 1.25, 200, 1, 2.0)], settings, BASE)
    assert set(state.next_jobs) == {RaceJob(BASE, 100, 0), RaceJob("2,1,1,1", 100, 0)} and not state.done
    state = race_state([Evaluation(BASE, 1.0, 100, 0, 2.0), Evaluation("2,1,1,1", 1.25, 100, 0, None)], settings, BASE)
    assert "diverged" in state.eliminated["2,1,1,1"] and state.alive == (BASE,)
    assert state.done and "no recurrent map beats the baseline" in state.verdict


def hand_race(gap: float, spread: float, n_seeds: int = 3) -> object:
    """A baseline and one recurrent map `gap` nats apart at every length (spread alternating by seed)."""
    flops = {BASE: 1.0, "2,2,1,1": 1.5}

    def loss(key: str, steps: int, seed: int) -> float:
        offsets = [0.0, spread, -spread, 0.5 * spread, -0.5 * spread]
        base = 2.0 - 0.1 * math.log2(steps / 100)
        return base + (gap + offsets[seed] if key != BASE else 0.001 * seed)

    return run_race(loss, flops, RaceSettings(100, 400, policy="fixed", seeds=tuple(range(n_seeds)), race_contenders=6))


def test_front_confirmed_and_verdict_when_a_map_beats_the_baseline():
    waves, evaluations, state = hand_race(gap=-0.2, spread=0.01)
    assert state.done and state.confirmed_better == ("2,2,1,1",)
    front = {p.map_key: p for p in state.front}
    assert set(front) == {BASE, "2,2,1,1"}
    point = front["2,2,1,1"]
    losses = [e.val_loss for e in evaluations if e.map_key == "2,2,1,1" and e.steps == 400]
    iv = seed_interval(losses, 0.9)
    assert point.steps == 400 and point.seeds == (0, 1, 2) and point.confirmed and state.best == "2,2,1,1"
    assert point.val_ppl == pytest.approx(math.exp(sum(losses) / 3))
    assert point.interval == pytest.approx(iv.interval_ppl)
    base_ppl = front[BASE].val_ppl
    assert "recurrence beats the baseline at 400 steps" in state.verdict and "2,2,1,1" in state.verdict
    assert f"{100 * (point.val_ppl / base_ppl - 1):+.2f}%" in state.verdict
    assert f"{point.val_ppl - base_ppl:+.4f} ppl" in state.verdict


def test_nothing_distinguishable_gives_the_seeds_that_would_decide():
    waves, evaluations, state = hand_race(gap=-0.01, spread=0.05)
    assert state.done and state.confirmed_better == () and "2,2,1,1" in state.alive
    assert state.verdict.startswith("nothing here is distinguishable from the baseline at 400 steps with 3 seeds")
    target = {
        k: {e.seed: e.val_loss for e in evaluations if e.map_key == k and e.steps == 400} for k in (BASE, "2,2,1,1")
    }
    need = paired_comparison(target["2,2,1,1"], target[BASE], 0.9).seeds_needed()
    assert need is not None and f"{need} seeds at 400 steps" in state.verdict
    assert not any(p.confirmed for p in state.front if p.map_key != BASE)
    assert state.alive[0] == "2,2,1,1" and state.best == BASE  # a lead within the noise is not reported as best


def test_one_seed_claims_nothing():
    waves, evaluations, state = hand_race(gap=-0.2, spread=0.01, n_seeds=1)
    assert state.done and state.confirmed_better == ()
    assert all(p.interval == (0.0, math.inf) and not p.confirmed for p in state.front if p.map_key != BASE)
    assert "with 1 seed " in state.verdict


# ----------------------------------------------------------------------------------------------------
# The replay over a truth table

GAPS = {
    BASE: (0.0, 0.002),
    "2,1,1,1": (-0.3, 0.01),
    "1,2,1,1": (0.2, 0.01),
    "1,1,2,1": (0.25, 0.02),
    "2,2,1,1": (0.3, 0.01),
    "1,1,1,2": (0.02, 0.05),
}


def test_race_replay_over_a_hand_made_truth_table(tmp_path):
    path = tmp_path / "truth.parquet"
    write_truth(path, GAPS)
    table = TruthTable.read(path)
    assert table.lengths == (100, 200, 400) and table.seeds_at(400) == (0, 1, 2, 3) and table.baseline == BASE
    report = replay_policy(path, "race-fixed", orders=4, n_seeds=3).to_json()
    assert report["table_better_than_baseline"] == ["2,1,1,1"] and report["table_decided_better"] == ["2,1,1,1"]
    assert report["decided_claimed_share"] == 1.0
    assert report["maps_claimed"] == 4 and report["false_claims"] == 0  # the one real win, in every order
    assert all(
        r["claimed"] == ["2,1,1,1"] and r["best"] == "2,1,1,1" and r["regret_sd"] == 0 for r in report["replays"]
    )
    assert 0 < report["mean_compute_steps"] < report["exhaustive_steps"]
    assert report["intervals"] > 0 and report["interval_coverage"] is not None
    assert len({tuple(r["seeds"]) for r in report["replays"]}) > 1  # the orders draw different seeds
    today = replay_policy(path, "today", orders=4).to_json()
    assert today["mean_compute_steps"] <= 6 * 100 + 3 * 100 and today["interval_coverage"] is None


def test_race_replay_stops_at_a_job_the_table_cannot_answer(tmp_path):
    path = tmp_path / "partial.parquet"
    write_truth(path, GAPS, seeds=3, drop=(("2,1,1,1", 200, 1),))
    table = TruthTable.read(path)
    replay = replay_race(table, order_seed=0, race=race_template("race-fixed"))
    assert ("2,1,1,1", 200, 1) in replay.unanswered
    assert replay.verdict.startswith("(race open at 200 steps)")  # it stopped there, undecided
    assert 0 < replay.compute_steps < sum(steps for (_, steps, _) in table.losses)


@pytest.mark.parametrize(
    "policy, changes",
    [
        ("fast", {}),
        ("race", {"orders": 0}),
        ("race", {"confidence": 1.5}),
        ("race", {"n_seeds": 3}),
        ("race", {"max_contenders": 0}),
    ],
)
def test_replay_policy_bad_input_is_one_error_line(tmp_path, policy, changes):
    path = tmp_path / "truth.parquet"
    write_truth(path, GAPS, seeds=2)
    before = path.read_bytes()
    with pytest.raises(UserInputError) as error:
        replay_policy(path, policy, **changes)
    assert len(str(error.value).splitlines()) == 1
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["truth.parquet"]


def test_replay_policy_json(tmp_path):
    path = tmp_path / "truth.parquet"
    write_truth(path, GAPS)
    report = json.loads(json.dumps(replay_policy(path, "race", orders=2).to_json()))
    assert report["policy"] == "race" and len(report["replays"]) == 2
    assert report["false_claim_share"] == 0.0


@pytest.mark.slow
def test_the_committed_truth_table_meets_the_issue_goals():
    """The race over benchmarks/data/truth-truth-small.parquet in 10 orders: at most 10% of its claims false in
    the table's seed mean, and the reported best within one seed sd of the table's best in every order."""
    report = replay_policy(ROOT / "benchmarks" / "data" / "truth-truth-small.parquet", "race").to_json()
    assert report["orders"] == 10 and report["maps"] >= 12
    assert report["false_claim_share"] <= 0.1
    assert report["regret_within_1sd_share"] == 1.0
    assert report["mean_compute_steps"] < report["exhaustive_steps"]
