"""The race's power measured on itself (commands/bench/power.py): gaps planted in hand-made truth tables whose answer
is known, the race replayed over them, and `bench power` on the command line."""

import json
import math

import pytest
from conftest import assert_one_line_error, write_truth

from ilr_search.commands.bench import TruthTable
from ilr_search.commands.bench.power import power_report
from ilr_search.commands.bench.truth import null_table, planted

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


def test_bench_power_cli_json(cli, table_path):
    proc = cli(
        "bench",
        "power",
        "--table",
        str(table_path),
        "--deltas",
        "0,4",
        "--crossing",
        "",
        "--orders",
        "2",
        "--maps",
        "2,1,1,1",
        "--policy",
        "race",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [(r["setting"], r["delta_sd"]) for r in report["rows"]] == [("adaptive", 0.0), ("adaptive", 4.0)]
    assert report["planted_maps"] == ["2,1,1,1"]
    assert math.isclose(report["rows"][1]["delta_nats"], 4 * report["seed_sd_at_target"])
    text = cli(
        "bench",
        "power",
        "--table",
        str(table_path),
        "--deltas",
        "4",
        "--crossing",
        "",
        "--orders",
        "1",
        "--policy",
        "race",
    ).stdout
    assert "power over" in text and "A/A" in text


@pytest.mark.parametrize(
    "args",
    [
        ["--deltas", "-1"],
        ["--deltas", "x"],
        ["--crossing", "1,nan"],
        ["--orders", "0"],
        ["--policy", "fast"],
        ["--maps", "9,9,9,9"],
        ["--maps", BASE],
        ["--fixed-seeds", "1"],
        ["--fixed-seeds", "99"],
    ],
)
def test_bench_power_bad_input_is_one_error_line_and_changes_nothing(cli, table_path, args):
    before = table_path.read_bytes()
    proc = cli("bench", "power", "--table", str(table_path), *args)
    assert_one_line_error(proc)
    assert table_path.read_bytes() == before and sorted(p.name for p in table_path.parent.iterdir()) == [
        "truth.parquet"
    ]
