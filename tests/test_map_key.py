"""MapKey: the study's key of a map and its knobs, parsed once (no reader splits `2,1,1,1|injection=add` by hand)."""

import pytest

from ilr_search.analysis.map_key import MapKey
from ilr_search.knobs import config_key
from ilr_search.training.schedule import ReuseMap


def test_a_key_parses_into_its_map_and_knobs_and_writes_back_the_same_text():
    for text in ("2,1,1,1", "2,1,1,1|injection=add", "1,1,1,1|iteration_norms=on,repeat_scale=lr"):
        key = MapKey.parse(text)
        assert key.key == str(key) == text and MapKey.parse(key.key) == key
    key = MapKey.parse("3,2,1,1|injection=gated")
    assert key.map == ReuseMap((3, 2, 1, 1)) and key.knobs == "injection=gated" and key.map.layer_runs == 7


def test_the_key_agrees_with_what_the_study_stores_and_knows_the_baseline():
    assert MapKey.of([2, 1, 1, 1], "injection=add").key == config_key("2,1,1,1", {"injection": "add"})
    assert MapKey.of([2, 1, 1, 1], None).key == config_key("2,1,1,1", {}) == "2,1,1,1"
    assert MapKey.parse("1,1,1,1").is_baseline and not MapKey.parse("1,1,1,1|injection=add").is_baseline
    assert not MapKey.parse("2,1,1,1").is_baseline


@pytest.mark.parametrize("key", ["deep5", "block2", "block:0-3:2"])
def test_a_key_that_is_no_reuse_map_is_not_the_plain_model_and_is_shown_as_it_is(key):
    from ilr_search.analysis.map_key import as_block, is_baseline_key, shown_key

    assert not is_baseline_key(key) and shown_key(key) == key and as_block(key) == key
    assert shown_key("1,1,1,1") == "plain" and is_baseline_key("1,1,1,1")
