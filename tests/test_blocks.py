"""The blocks family: one contiguous block of layers run R times as a block (`block:I-J:R`), its value type and
parser, its FLOPs, and a tiny real study that searches block maps only."""

import json

import optuna
import pytest
from conftest import assert_one_line_error, run_cli, write_space

from ilr_search.search.maps import BLOCK_PARAMS, parse_enqueued, repair_block
from ilr_search.training.schedule import Map, ScheduleError


def test_parse_format_schedule_and_key_round_trip():
    block = Map.parse("block:1-2:2", 4)
    assert block == Map.of_block(1, 2, 2, 4) and block.key == str(block) == "block:1-2:2"
    assert block.schedule() == [0, 1, 2, 1, 2, 3] and block.counts == (1, 2, 2, 1) and block.layer_runs == 6
    assert not block.is_baseline
    assert Map.parse(block.key, 4) == block and Map.parse("block:1-2:2|injection=add", 4).with_knobs("") == block
    assert Map.parse("block:0-3:2", 4).schedule() == [0, 1, 2, 3, 0, 1, 2, 3]  # block2's schedule


def test_a_block_with_a_reuse_maps_schedule_is_that_reuse_map():
    one_layer = Map.parse("block:2-2:3", 4)
    assert one_layer == Map.of_counts((1, 1, 3, 1)) and one_layer.key == "1,1,3,1"
    assert one_layer.schedule() == Map.of_block(2, 2, 3, 4).schedule() == [0, 1, 2, 2, 2, 3]
    assert Map.parse("block:1-2:1", 4) == Map.baseline(4)


@pytest.mark.parametrize("text", ["block:2-1:2", "block:1-4:2", "block:1-2:0", "block:1-2", "block:a-b:c"])
def test_bad_block_maps_are_refused(text):
    with pytest.raises(ScheduleError):
        Map.parse(text, 4)


def test_repair_shrinks_the_repeats_then_the_block():
    assert repair_block(1, 2, 3, 4, 8) == Map.of_block(1, 2, 3, 4)  # 4 + 2*2 = 8: fits
    assert repair_block(2, 1, 3, 4, 7) == Map.of_block(1, 2, 2, 4)  # either order; R 3 -> 2
    assert repair_block(0, 3, 3, 4, 6) == Map.of_block(0, 1, 2, 4)  # R 2 still over: the block shrinks
    assert repair_block(0, 3, 2, 4, 4) == Map.of_block(0, 3, 1, 4)  # nothing fits: the baseline
    for args in [(1, 2, 3, 4, 7), (0, 3, 3, 4, 6), (3, 3, 2, 4, 6)]:
        fitted = repair_block(*args)
        assert repair_block(fitted.start, fitted.end, fitted.repeats, 4, args[-1]) == fitted  # idempotent


def test_enqueued_block_maps_follow_the_families():
    entry = parse_enqueued("block:0-3:3", 4, 3, 10, (), ("blocks",))
    assert entry.params(()) == {"block_start": 0, "block_end": 3, "block_repeats": 2}  # 16 runs over 10: R 3 -> 2
    assert entry.repaired_from == (3, 3, 3, 3)
    both = parse_enqueued("2,1,1,1", 4, 3, 8, (), ("ilr", "blocks"))
    assert both.params(())["family"] == "ilr"
    assert parse_enqueued("block2", 4, 3, 8, (), ("blocks",)).params(()) == {
        "block_start": 0,
        "block_end": 3,
        "block_repeats": 2,
    }  # a trial, not a reference run
    assert parse_enqueued("1,3,1,1", 4, 3, 8, (), ("blocks",)).params(()) == {
        "block_start": 1,
        "block_end": 1,
        "block_repeats": 3,
    }
    with pytest.raises(Exception, match="block maps only"):
        parse_enqueued("2,2,1,1", 4, 3, 8, (), ("blocks",))
    with pytest.raises(Exception, match="families includes 'blocks'"):
        parse_enqueued("block:1-2:2", 4, 3, 8, (), ("ilr", "block"))


def test_flops_of_a_block_map(cli):
    proc = cli("flops", "--reuse-map", "block:1-2:2", "--layers", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["schedule"] == [0, 1, 2, 1, 2, 3] and report["map"] == "block:1-2:2"
    assert report["reuse_map"] == [1, 2, 2, 1] and 1 < report["flops_ratio"] < 1.5


@pytest.mark.parametrize("text", ["block:2-1:2", "block:1-4:2", "block:1-2:0", "block:1-2"])
def test_bad_block_maps_exit_2_with_one_line(cli, tmp_path, text):
    proc = cli("flops", "--reuse-map", text, "--layers", "4", "--json")
    assert_one_line_error(proc)
    proc = cli("train", "--reuse-map", text, "--layers", "4", "--steps", "2", "--save", str(tmp_path / "m"))
    assert_one_line_error(proc)
    assert not (tmp_path / "m").exists()


@pytest.fixture(scope="module")
def blocks_study(tmp_path_factory, token_cache):
    """A 4-trial study searching block maps only (2x: 8 layer runs), block:1-2:2 asked for."""
    root = tmp_path_factory.mktemp("blocks")
    space = write_space(root / "space.toml", search={"noise_seeds": 0, "families": ["blocks"]})
    db = root / "b.db"
    args = [
        "run",
        "--space",
        str(space),
        "--budget",
        "2x",
        "--steps",
        "8",
        "--n-trials",
        "4",
        "--study",
        "b",
        "--storage",
        f"sqlite:///{db}",
        "--json",
        "--enqueue",
        "block:1-2:2",
    ]
    proc = run_cli(args, root, {"ILR_SEARCH_CACHE": str(token_cache)})
    assert proc.returncode == 0, proc.stderr
    return root, db


@pytest.mark.slow
def test_a_blocks_study_proposes_blocks_within_budget_once_each(blocks_study, cli):
    root, db = blocks_study
    trials = optuna.load_study(study_name="b", storage=f"sqlite:///{db}").trials
    keys = [t.user_attrs["map_key"] for t in trials]
    assert keys[:2] == ["1,1,1,1", "block:1-2:2"]  # the baseline, then the map asked for
    for t in trials:
        assert set(t.params) == set(BLOCK_PARAMS)  # only block parameters: no per-layer counts, no family
        chosen = Map.parse(t.user_attrs["map_key"], 4)
        assert chosen.layer_runs <= 8 and chosen.key == t.user_attrs["map_key"]
    trained = [t.user_attrs["map_key"] for t in trials if "reused_from" not in t.user_attrs]
    assert len(trained) == len(set(trained))  # no schedule trained twice
    listed = json.loads(cli("trials", "--study", "b", "--storage", f"sqlite:///{db}", "--json", cwd=root).stdout)
    rows = listed["trials"] if isinstance(listed, dict) else listed
    assert "block:1-2:2" in {r.get("map") for r in rows}
    front = json.loads(cli("pareto", "--study", "b", "--storage", f"sqlite:///{db}", "--json", cwd=root).stdout)
    assert all("map" in p for p in front["pareto"])
    assert {p["map"] for p in front["pareto"]} <= set(keys)
