"""The Map value type: one parser for every form of a map (per-layer counts with parts, blocks, the whole stack, the
deeper plain model, knobs after `|`); its text is the key a study stores and reads back to an equal value; it knows
its kind, the baseline, its depth of compute and its execution schedule, and it refuses what a model cannot run."""

import pytest

from ilr_search.errors import UserInputError
from ilr_search.knobs import config_key
from ilr_search.training.schedule import (
    Map,
    ScheduleError,
    as_block,
    format_reuse_map,
    is_baseline_key,
    resolve_schedule,
    reuse_map_schedule,
    shown_key,
)


def test_parse_format_and_key_round_trip():
    m = Map.parse(" 4, 2,1,1", 4)
    assert m.counts == (4, 2, 1, 1) and str(m) == m.key == "4,2,1,1"
    assert Map.parse(m.key, 4) == m
    assert Map.parse("4,2,1,1", 4).counts == (4, 2, 1, 1) and format_reuse_map([4, 2, 1, 1]) == m.key


def test_baseline_depth_and_schedule():
    base = Map.baseline(3)
    assert base.counts == (1, 1, 1) and base.is_baseline and base.layer_runs == 3
    m = Map.of_counts((2, 1, 3))
    assert not m.is_baseline and m.layer_runs == 6
    assert m.schedule() == [0, 0, 1, 2, 2, 2] == reuse_map_schedule([2, 1, 3])
    assert resolve_schedule(3, "2,1,3") == ([2, 1, 3], [0, 0, 1, 2, 2, 2], None)


@pytest.mark.parametrize(
    "text, layers, message",
    [
        ("2,1", 3, "has 2 entries but the model has 3 layers"),
        ("2,0,1", 3, "count below 1"),
        ("2,x,1", 3, "must be one entry per layer, comma-separated, each R"),
        ("deep5", 3, "no map of a model of 3 layers"),
    ],
)
def test_a_map_the_model_cannot_run_is_refused(text, layers, message):
    with pytest.raises(UserInputError, match=message):
        Map.parse(text, layers).checked(layers)


def test_max_reuse_is_checked_where_asked():
    assert Map.of_counts((4, 1)).checked(2, max_reuse=4) == Map.of_counts((4, 1))
    with pytest.raises(UserInputError, match="above the space's max_reuse 3"):
        Map.of_counts((4, 1)).checked(2, max_reuse=3)
    with pytest.raises(UserInputError, match="above the space's max_reuse 3"):
        resolve_schedule(2, [4, 1], max_reuse=3)


@pytest.mark.parametrize(
    "text, kind, schedule",
    [
        ("1,1,1,1", "plain", [0, 1, 2, 3]),
        ("plain", "plain", [0, 1, 2, 3]),
        ("2,1,1,1", "layers", [0, 0, 1, 2, 3]),
        ("1,2a,1,1", "layers", [0, 1, 1, 2, 3]),
        ("block:1-2:2", "block", [0, 1, 2, 1, 2, 3]),
        ("block2", "stack", [0, 1, 2, 3, 0, 1, 2, 3]),
        ("deep6", "deeper", [0, 1, 2, 3, 4, 5]),
    ],
)
def test_every_form_parses_to_its_kind_and_schedule_and_round_trips(text, kind, schedule):
    chosen = Map.parse(text, 4)
    assert chosen.kind == kind and chosen.schedule() == schedule
    assert Map.parse(str(chosen), 4) == chosen and hash(Map.parse(str(chosen), 4)) == hash(chosen)
    assert Map.form_of(text) == chosen.form
    with_knobs = Map.parse(f"{text}|injection=add", 4)
    assert str(with_knobs) == f"{chosen}|injection=add" and with_knobs.knob_settings == {"injection": "add"}
    assert with_knobs != chosen and with_knobs.with_knobs("") == chosen


def test_the_stack_and_its_block_share_a_schedule_but_not_a_key():
    stack, block = Map.parse("block2", 4), Map.of_block(0, 3, 2, 4)
    assert stack.schedule() == block.schedule() and stack.counts == block.counts
    assert (str(stack), str(block)) == ("block2", "block:0-3:2") and stack != block
    assert stack.stack_repeats == 2 and block.stack_repeats is None
    assert Map.parse("deep5").n_layers == 5 and Map.of_deeper(5).key == "deep5"


@pytest.mark.parametrize("text", ["block2a", "blockx", "block0", "block:1-2", "block:3-1:2"])
def test_a_stack_or_block_that_is_no_map_is_refused(text):
    with pytest.raises(ScheduleError):
        Map.parse(text, 4)


def test_a_block_needs_the_number_of_layers():
    with pytest.raises(ScheduleError, match="need the number of layers"):
        Map.parse("block:1-2:2")
    assert Map.parse("2,1,1").n_layers == 3  # per-layer counts give it


def test_a_key_parses_into_its_map_and_knobs_and_writes_back_the_same_text():
    for text in ("2,1,1,1", "2,1,1,1|injection=add", "1,1,1,1|iteration_norms=on,repeat_scale=lr"):
        key = Map.parse(text)
        assert key.key == str(key) == text and Map.parse(key.key) == key
    key = Map.parse("3,2,1,1|injection=gated")
    assert key.with_knobs("") == Map.of_counts((3, 2, 1, 1)) and key.knobs == "injection=gated"
    assert key.layer_runs == 7


def test_the_key_agrees_with_what_the_study_stores_and_knows_the_baseline():
    assert Map.of_counts([2, 1, 1, 1]).with_knobs("injection=add").key == config_key("2,1,1,1", {"injection": "add"})
    assert Map.of_counts([2, 1, 1, 1]).key == config_key("2,1,1,1", {}) == "2,1,1,1"
    assert Map.parse("1,1,1,1").kind == "plain" and Map.parse("1,1,1,1|injection=add").kind != "plain"
    assert Map.parse("1,1,1,1|injection=add").is_baseline and not Map.parse("2,1,1,1").is_baseline


@pytest.mark.parametrize("key", ["deep5", "block2", "block:0-3:2"])
def test_a_key_that_is_no_reuse_map_is_not_the_plain_model_and_is_shown_as_it_is(key):
    assert not is_baseline_key(key) and shown_key(key) == key and as_block(key) == key
    assert shown_key("1,1,1,1") == "plain" and is_baseline_key("1,1,1,1")
