"""The ReuseMap value type: it parses and formats itself, its text is the map key a study stores, it knows the
baseline, its depth of compute and its execution schedule, and it refuses what a model cannot run."""

import pytest

from ilr_search.errors import UserInputError
from ilr_search.training.schedule import (
    ReuseMap,
    format_reuse_map,
    resolve_schedule,
    reuse_map_schedule,
)


def test_parse_format_and_key_round_trip():
    m = ReuseMap.parse(" 4, 2,1,1", 4)
    assert m.counts == (4, 2, 1, 1) and str(m) == m.key == "4,2,1,1"
    assert ReuseMap.parse(m.key, 4) == m
    assert ReuseMap.parse("4,2,1,1", 4).counts == (4, 2, 1, 1) and format_reuse_map([4, 2, 1, 1]) == m.key


def test_baseline_depth_and_schedule():
    base = ReuseMap.baseline(3)
    assert base.counts == (1, 1, 1) and base.is_baseline and base.layer_runs == 3
    m = ReuseMap((2, 1, 3))
    assert not m.is_baseline and m.layer_runs == 6
    assert m.schedule() == [0, 0, 1, 2, 2, 2] == reuse_map_schedule([2, 1, 3])
    assert resolve_schedule(3, "2,1,3") == ([2, 1, 3], [0, 0, 1, 2, 2, 2], None)


@pytest.mark.parametrize(
    "text, layers, message",
    [
        ("2,1", 3, "has 2 entries but the model has 3 layers"),
        ("2,0,1", 3, "count below 1"),
        ("2,x,1", 3, "must be one entry per layer, comma-separated, each R"),
    ],
)
def test_a_map_the_model_cannot_run_is_refused(text, layers, message):
    with pytest.raises(UserInputError, match=message):
        ReuseMap.parse(text, layers)


def test_max_reuse_is_checked_where_asked():
    assert ReuseMap((4, 1)).checked(2, max_reuse=4) == ReuseMap((4, 1))
    with pytest.raises(UserInputError, match="above the space's max_reuse 3"):
        ReuseMap((4, 1)).checked(2, max_reuse=3)
    with pytest.raises(UserInputError, match="above the space's max_reuse 3"):
        resolve_schedule(2, [4, 1], max_reuse=3)
