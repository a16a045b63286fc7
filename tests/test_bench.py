import itertools

import pytest
from replays.hypervolume import hypervolume_2d, replay, table_entries

from ilr_search.commands.bench import Table, build_table, feasible_maps
from ilr_search.config import PrunerSettings
from ilr_search.options import BenchBuildOptions


def test_hypervolume_hand_computed():
    assert hypervolume_2d([(1, 1)], (2, 2)) == 1
    assert hypervolume_2d([(1, 2), (2, 1)], (3, 3)) == 3  # 2 + 2 - the overlapping unit square
    assert hypervolume_2d([(1, 2), (2, 1), (2.5, 2.5)], (3, 3)) == 3  # a dominated point adds nothing
    assert hypervolume_2d([(1, 1), (1, 1)], (2, 3)) == 2  # duplicates count once
    assert hypervolume_2d([(4, 1), (1, 4)], (3, 3)) == 0  # outside the reference point
    assert hypervolume_2d([], (3, 3)) == 0
    assert hypervolume_2d([(0.5, 2.0), (1.0, 1.0), (2.0, 0.5)], (3, 3)) == pytest.approx(
        (1.0 - 0.5) * 1.0 + (2.0 - 1.0) * 2.0 + (3.0 - 2.0) * 2.5
    )


def test_feasible_maps():
    maps = feasible_maps(4, 3, 8)
    assert len(maps) == 50 and [1, 1, 1, 1] in maps and all(sum(m) <= 8 for m in maps)


@pytest.fixture(scope="module")
def tiny_table(tmp_path_factory, token_cache):
    root = tmp_path_factory.mktemp("bench")
    space = root / "bench-tiny.toml"
    space.write_text("""
[model]
layers = 2
d_model = 16
heads = 2
seq_len = 32
[train]
steps = 16
batch_size = 4
eval_fractions = [0.25, 0.5, 1.0]
eval_windows = 4
dtype = "fp32"
device = "cpu"
[search]
max_reuse = 3
""")
    out = root / "tiny.parquet"
    db = f"sqlite:///{root / 'b.db'}"
    report = build_table(BenchBuildOptions(space=space, out=out, budget="2x", storage=db)).to_json()
    assert report["feasible_maps"] == len(feasible_maps(2, 3, 4))
    assert report["maps"] == report["feasible_maps"] + 1  # every feasible map, and block recurrence K=2
    again = build_table(BenchBuildOptions(space=space, out=root / "again.parquet", budget="2x", storage=db)).to_json()
    assert again["maps"] == report["maps"]  # resumed: nothing new was trained
    return Table.read(out)


@pytest.mark.slow
def test_table_holds_every_map_with_its_curve(tiny_table):
    assert len(table_entries(tiny_table)) == 6 and tiny_table.rungs == (4, 8)
    assert [r.map_key for r in tiny_table.rows if r.reuse_map is None] == ["block2"]
    assert all(set(e["curve"]) == {4, 8, 16} for e in table_entries(tiny_table).values())


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["random", "tpe", "nsga2"])
def test_replay_is_deterministic_for_a_seed(tiny_table, sampler):
    a = replay(
        tiny_table,
        sampler,
        seed=3,
        n_trials=8,
        pruning=True,
        settings=PrunerSettings(warmup=2, calibration_maps=3),
        rung_fractions=(0.25, 0.5),
    )
    b = replay(
        tiny_table,
        sampler,
        seed=3,
        n_trials=8,
        pruning=True,
        settings=PrunerSettings(warmup=2, calibration_maps=3),
        rung_fractions=(0.25, 0.5),
    )
    assert a.steps == b.steps and a.hv_fraction == b.hv_fraction
    assert 0 < a.hv_fraction[-1] <= 1.0 + 1e-12
    assert all(x <= y for x, y in itertools.pairwise(a.steps))
    full = replay(tiny_table, "random", seed=0, n_trials=40, pruning=False)
    assert full.hv_fraction[-1] == pytest.approx(1.0)  # every map found: the exhaustive front
