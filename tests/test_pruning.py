import random

import pytest

from ilr_search.analysis.pareto import non_dominated, pareto_front
from ilr_search.search.pruners import pareto_decision
from ilr_search.storage import CurvePoint, JournalStore, SQLStore

ETA, EPS, WARMUP = 3.0, 0.0, 3


def pt(trial, loss, ratio, step=10):
    return CurvePoint(trial, step, loss, ratio, f"map{trial}")


def test_a_dominated_trial_is_pruned():
    peers = [pt(0, 3.0, 1.0), pt(1, 2.9, 1.2), pt(2, 2.8, 1.5), pt(3, 2.95, 1.3), pt(4, 2.7, 1.5)]
    me = pt(5, 3.5, 1.5)  # worse and dearer than all
    decision = pareto_decision(me, peers + [me], ETA, EPS, WARMUP)
    assert not decision.keep and set(decision.dominated_by) == {0, 1, 2, 3, 4}
    assert "dominated" in decision.reason


def test_a_cheap_non_dominated_trial_is_kept_even_with_the_worst_loss():
    peers = [pt(0, 2.5, 1.4), pt(1, 2.4, 1.5), pt(2, 2.6, 1.3), pt(3, 2.55, 1.35), pt(4, 2.45, 1.45)]
    me = pt(5, 4.0, 1.0)  # worst loss, but the cheapest: nothing dominates it
    decision = pareto_decision(me, peers + [me], ETA, EPS, WARMUP)
    assert decision.keep and decision.dominated_by == ()


def test_warm_up_is_respected():
    me = pt(2, 9.0, 2.0)
    assert pareto_decision(me, [pt(0, 1.0, 1.0), pt(1, 1.0, 1.0), me], ETA, EPS, warmup=4).keep
    assert not pareto_decision(me, [pt(0, 1.0, 1.0), pt(1, 1.1, 1.0), pt(3, 1.2, 1.1), me], ETA, EPS, warmup=4).keep


def test_ties_are_kept_or_pruned_together():
    tied = [pt(0, 3.0, 1.5), pt(1, 3.0, 1.5)]
    good = [pt(2, 2.0, 1.0), pt(3, 2.1, 1.0), pt(4, 2.2, 1.0), pt(5, 2.3, 1.0)]
    decisions = [pareto_decision(me, tied + good, ETA, EPS, WARMUP) for me in tied]
    assert not decisions[0].keep and not decisions[1].keep
    # a point tied with a front point is not dominated by it and stays
    front_tie = [pt(0, 2.0, 1.0), pt(1, 2.0, 1.0), pt(2, 3.0, 2.0), pt(3, 3.1, 2.0)]
    assert pareto_decision(front_tie[1], front_tie, ETA, EPS, WARMUP).keep


def test_epsilon_keeps_near_front_points():
    peers = [pt(i, 2.0, 1.0) for i in range(5)] + [pt(5, 2.01, 1.5)]
    me = peers[-1]
    peers = [CurvePoint(p.trial_number, p.step, p.val_loss, p.flops_ratio, f"m{p.trial_number}") for p in peers]
    me = peers[-1]
    assert not pareto_decision(me, peers, 6.0, 0.0, WARMUP).keep
    assert pareto_decision(me, peers, 6.0, 0.01, WARMUP).keep


def test_same_map_counts_once():
    same = [CurvePoint(i, 10, 2.0, 1.0, "same") for i in range(5)]
    me = pt(9, 3.0, 1.5)
    assert pareto_decision(me, same + [me], ETA, EPS, WARMUP).keep  # only 2 distinct maps: warm-up


@pytest.mark.parametrize("kind", ["sql", "journal"])
def test_two_workers_deciding_on_the_same_data_decide_the_same(tmp_path, kind):
    import sqlalchemy as sa

    if kind == "sql":
        url = f"sqlite:///{tmp_path / 'p.db'}"
        a, b = SQLStore(sa.create_engine(url), "s"), SQLStore(sa.create_engine(url), "s")
    else:
        a, b = JournalStore(str(tmp_path / "j.log"), "s"), JournalStore(str(tmp_path / "j.log"), "s")
    rng = random.Random(0)
    for trial in range(12):
        a.add_curve_point(CurvePoint(trial, 10, rng.uniform(2, 3), rng.choice([1.0, 1.25, 1.5]), f"m{trial}"), 100)
    other_study = (
        SQLStore(sa.create_engine(f"sqlite:///{tmp_path / 'p.db'}"), "other")
        if kind == "sql"
        else JournalStore(str(tmp_path / "j.log"), "other")
    )
    other_study.add_curve_point(CurvePoint(0, 10, 0.1, 0.1, "x"), 1)  # another study's data does not leak in
    points_a, points_b = a.curve_points(step=10), b.curve_points(step=10)
    assert points_a == points_b and len(points_a) == 12
    decisions_a = [pareto_decision(p, points_a, ETA, EPS, WARMUP) for p in points_a]
    decisions_b = [pareto_decision(p, list(reversed(points_b)), ETA, EPS, WARMUP) for p in points_b]
    assert decisions_a == decisions_b
    assert any(not d.keep for d in decisions_a) and any(d.keep for d in decisions_a)


def brute_force_front(points):
    return [i for i, p in enumerate(points) if not any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in points)]


def test_front_equals_brute_force_on_random_points():
    rng = random.Random(1)
    for _ in range(50):
        points = [(round(rng.uniform(1, 2), 2), rng.choice([1.0, 1.25, 1.5, 1.75])) for _ in range(rng.randint(1, 30))]
        expected = {points[i] for i in brute_force_front(points)}
        assert {points[i] for i in non_dominated(points)} == expected
        rows = [{"val_ppl": y, "flops_ratio": x} for y, x in points]
        front = pareto_front(rows, lambda r: (r["val_ppl"], r["flops_ratio"]))
        assert {(r["val_ppl"], r["flops_ratio"]) for r in front} == expected


def test_a_retried_map_with_another_loss_at_the_rung_is_judged_on_its_own_loss():
    # the dead predecessor reached the rung with another loss (nondeterministic GPU runs, another machine)
    from ilr_search.config import PrunerSettings
    from ilr_search.search.pruners import decision_at_rung

    peers = [pt(i, 2.0 + 0.01 * i, 1.0) for i in range(5)] + [CurvePoint(7, 10, 2.5, 1.5, "retried")]
    me = CurvePoint(8, 10, 2.6, 1.5, "retried")
    assert not pareto_decision(me, peers + [me], ETA, EPS, WARMUP).keep  # no StopIteration
    settings = PrunerSettings(name="pareto", rungs=(10,), calibration_maps=3)
    assert decision_at_rung(me, peers + [me], 20, settings).keep  # no complete map yet: calibrating
