"""The race's power measured on itself (benchmarks/replays/power.py): gaps planted in hand-made truth tables whose
answer is known, the race replayed over them, and power_report's settings checked."""

import json
import math

import pytest
from conftest import write_truth
from replays.policy import race_template
from replays.power import parse_deltas, power_report
from replays.truth import TruthTable, null_table, planted

from ilr_search.errors import UserInputError

BASE = "1,1,1,1"
# no map beats the baseline: its recurrent maps are 0.05-0.2 nats worse at the target, seed sd 0.02
NO_WINNER = {BASE: (0.0, 0.02), "2,1,1,1": (0.05, 0.02), "1,2,1,1": (0.1, 0.02), "1,1,2,1": (0.2, 0.02)}


@pytest.fixture
def table_path(tmp_path):
    path = tmp_path / "truth.parquet"
    write_truth(path, NO_WINNER, seeds=10)
    return path


def test_a_planted_map_gets_the_baselines_mean_minus_the_gap_and_keeps_its_own_noise(table_path):
    table = TruthTable.read(table_path)
    gap = 0.03
    for crossing in (False, True):
        moved = planted(table, "1,2,1,1", gap, crossing)
        for steps in table.lengths:
            want = gap if not crossing else {100: -gap, 200: 0.0, 400: gap}[steps]
            assert moved.seed_mean("1,2,1,1", steps) == pytest.approx(table.seed_mean(BASE, steps) - want)
            deviations = [table.losses[("1,2,1,1", steps, s)] - table.seed_mean("1,2,1,1", steps) for s in range(10)]
            moved_dev = [moved.losses[("1,2,1,1", steps, s)] - moved.seed_mean("1,2,1,1", steps) for s in range(10)]
            assert moved_dev == pytest.approx(deviations)
        assert moved.seed_mean("2,1,1,1", 400) == table.seed_mean("2,1,1,1", 400)  # the others unchanged
    null = null_table(table)
    for key in NO_WINNER:
        assert null.seed_mean(key, 400) == pytest.approx(table.seed_mean(BASE, 400))


def test_a_large_planted_gap_is_claimed_and_nothing_is_claimed_at_zero(table_path):
    report = power_report(table_path, deltas=(0.0, 6.0), crossing=(6.0,), orders=3).to_json()
    rows = {(r["setting"], r["delta_sd"], r["crossing"]): r for r in report["rows"]}
    assert report["seed_sd_at_target"] == pytest.approx(0.02, rel=0.3)
    adaptive = rows[("adaptive", 6.0, False)]
    assert adaptive["replays"] == 3 * 3 and adaptive["power"] == 1.0 and adaptive["false_claims"] == 0.0
    assert rows[("adaptive", 6.0, True)]["power"] == 1.0  # worse at the base length, better at the target: found
    for setting in ("adaptive", "fixed-3-seeds"):
        null = rows[(setting, 0.0, False)]
        assert null["replays"] == 3 and null["power"] is None and null["any_claim"] == 0.0
    assert rows[("fixed-3-seeds", 6.0, True)]["power"] < 1.0  # the fixed race eliminates the slow starter early
    assert all(r["mean_compute_steps"] > 0 for r in report["rows"])


def test_power_report_json(table_path):
    report = json.loads(
        json.dumps(
            power_report(
                table_path,
                {"adaptive": race_template("race")},
                parse_deltas("0,4"),
                (),
                orders=2,
                maps=["2,1,1,1"],
                n_seeds={},
            ).to_json()
        )
    )
    assert [(r["setting"], r["delta_sd"]) for r in report["rows"]] == [("adaptive", 0.0), ("adaptive", 4.0)]
    assert report["planted_maps"] == ["2,1,1,1"]
    assert math.isclose(report["rows"][1]["delta_nats"], 4 * report["seed_sd_at_target"])


@pytest.mark.parametrize(
    "deltas, crossing, changes",
    [
        ("-1", "", {}),
        ("x", "", {}),
        ("0", "1,nan", {}),
        ("0", "", {"orders": 0}),
        ("0", "", {"maps": ["9,9,9,9"]}),
        ("0", "", {"maps": [BASE]}),
        ("0", "", {"against": "worst"}),
    ],
)
def test_power_report_bad_input_is_one_error_line_and_changes_nothing(table_path, deltas, crossing, changes):
    before = table_path.read_bytes()
    with pytest.raises(UserInputError) as error:
        power_report(table_path, None, parse_deltas(deltas), parse_deltas(crossing) if crossing else (), **changes)
    assert len(str(error.value).splitlines()) == 1
    assert table_path.read_bytes() == before and sorted(p.name for p in table_path.parent.iterdir()) == [
        "truth.parquet"
    ]
