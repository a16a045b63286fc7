"""Blocks searched frozen: the grid sampler evaluates every feasible block once, and TPE never proposes an evaluated
block while others remain (search/maps.feasible_blocks, samplers.BudgetRepairSampler)."""

import json
import sqlite3

import pytest
from conftest import frozen_run_args, write_space

from ilr_search.search.maps import feasible_blocks
from ilr_search.training.schedule import as_block

# frozen and trained studies that race, as on one core: no race worker processes (conftest.one_core)
pytestmark = pytest.mark.usefixtures("one_usable_core")


def test_feasible_blocks_are_every_block_within_the_budget():
    blocks = feasible_blocks(4, 3, 6)  # 4 layers, 2 extra layer runs: 2 repeats of 1 or 2 layers, 3 of 1 layer
    assert len(blocks) == 4 + 3 + 4 and len(set(blocks)) == len(blocks)
    assert all(b.layer_runs <= 6 and b.repeats >= 2 for b in blocks)
    assert feasible_blocks(30, 2, 30 + 12)[0].key == "block:0-0:2" and len(feasible_blocks(30, 2, 42)) == sum(
        31 - length for length in range(1, 13)
    )


def evaluated_keys(db) -> list[str]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("select value_json from trial_user_attributes where key = 'map_key'").fetchall()
    return [json.loads(v) for (v,) in rows]


@pytest.mark.parametrize("sampler,trials", [("grid", None), ("tpe", 12)])
def test_every_block_is_evaluated_once(cli, tmp_path, recurrent_checkpoint, sampler, trials):
    space = write_space(
        tmp_path / "scan.toml",
        search={
            "families": ["blocks"],
            "max_reuse": 3,
            "sampler": sampler,
            "n_trials": trials or 5,
            "race_seeds": 1,
            "target": 1.0,
        },
        train={"eval_windows": 4},
    )
    db = tmp_path / "scan.db"
    proc = cli(
        *frozen_run_args(space, recurrent_checkpoint, "1.5x", f"sqlite:///{db}"),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    expected = {b.canonical().key for b in feasible_blocks(4, 3, 6)} | {"1,1,1,1"}
    keys = evaluated_keys(db)
    assert sorted(keys) == sorted(expected), (keys, expected)  # each once: no trial reused another's map
    assert summary["n_trials"] == len(expected)
    if sampler == "grid":
        assert "every feasible block evaluated once, 11 of them" in proc.stderr


def test_the_blocks_scan_preset_scans_a_checkpoint(cli, tmp_path, recurrent_checkpoint):
    db = tmp_path / "preset.db"
    proc = cli(
        *frozen_run_args("blocks-scan", recurrent_checkpoint, "1.25x", f"sqlite:///{db}"),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    expected = {b.canonical().key for b in feasible_blocks(4, 4, 5)} | {"1,1,1,1"}
    assert sorted(evaluated_keys(db)) == sorted(expected)
    assert "every feasible block evaluated once, 4 of them" in proc.stderr


def test_damping_on_the_plain_map_is_the_plain_map(cli, tmp_path, recurrent_checkpoint):
    """damping acts on repeated passes only: the plain map asked for with it, or proposed with it, is the plain
    map's one evaluation, never a map of its own that the race would spend chunks on."""
    space = write_space(
        tmp_path / "damped.toml",
        search={"families": ["blocks"], "max_reuse": 2, "sampler": "random", "n_trials": 12, "race_seeds": 1},
        train={"eval_windows": 4},
    )
    db = tmp_path / "damped.db"
    proc = cli(
        *frozen_run_args(space, recurrent_checkpoint, "1.5x", f"sqlite:///{db}"),
        "--knobs",
        "damping",
        "--enqueue",
        "1,1,1,1|damping=0.5",
        "--enqueue",
        "block:1-2:2|damping=0.5",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    keys = evaluated_keys(db)
    assert "block:1-2:2|damping=0.5" in keys and keys.count("1,1,1,1") >= 2, keys
    assert not [k for k in keys if k.startswith("1,1,1,1|")], keys
    # a study of blocks prints a one-layer block as block:I-I:R in every table of `trials`, never as counts
    listed = cli("trials", "--storage", f"sqlite:///{db}")
    assert listed.returncode == 0, listed.stderr
    one_layer = {k.split("|")[0] for k in keys if as_block(k) != k}
    assert one_layer, keys
    for key in one_layer:
        assert as_block(key) in listed.stdout and key not in listed.stdout, (key, listed.stdout)


def test_a_one_layer_block_that_repeats_one_branch_is_written_as_that_block():
    # A frozen block search with --parts both,attn,mlp stopped on `block:I-I:Rm`: its canonical key is a reuse map
    # (`1,1,4m,1`), and as_block read every entry as a whole number (ValueError: '4m').
    from ilr_search.training.schedule import Map

    assert as_block("1,1,4m,1") == "block:2-2:4m"
    assert as_block("1,3a,1,1|adapters=8") == "block:1-1:3a|adapters=8"
    assert as_block("2a,2a,1,1") == "2a,2a,1,1"  # two layers repeated: no one block
    assert Map.parse(as_block("1,1,4m,1"), 4).key == "1,1,4m,1"
