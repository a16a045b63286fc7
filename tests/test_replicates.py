"""A study's replicates, chosen once from its race settings: the words, lengths and scores its output uses."""

import math

from ilr_search.analysis.race_core import RaceSettings
from ilr_search.analysis.replicates import Replicates


def test_a_trained_study_says_seeds_and_steps():
    words = Replicates.of(RaceSettings(100, 400))
    assert words == Replicates.of(None) == Replicates()
    assert words.trains and (words.unit, words.plural, words.maps, words.verb) == ("seed", "seeds", "trials", "train")
    assert words.at(400) == "at 400 steps" and words.where(400, 3) == "at 400 steps, seed 3"
    assert words.count(1, test=True) == "1 test seed" and words.doing("map 2,1") == "training map 2,1"
    assert words.screened(0) == "the proxy trial's" and words.score(12.3456) == "ppl 12.35"


def test_a_frozen_study_says_chunks_of_windows_or_items_and_its_measure():
    windows = Replicates.of(RaceSettings(0, 0, frozen=True, judged="answer"))
    assert not windows.trains and windows == Replicates(frozen=True, judged="answer")
    assert windows.at(0) == "on held-out windows" and windows.where(0, 3) == "on window chunk 3"
    assert windows.doing("map 2,1") == "evaluating map 2,1 on window chunk 0" and windows.finished == "maps evaluated"
    assert windows.score(math.e) == "answer loss 1" and windows.column == "answer loss"
    items = Replicates.of(RaceSettings(0, 0, frozen=True, items=True, judged="accuracy"))
    assert items == Replicates(frozen=True, items=True, judged="accuracy")
    assert (items.unit, items.paired, items.chunk_of) == ("item chunk", "item", "task items")
    assert items.count(2, test=True) == "2 test item chunks" and items.score(math.exp(0.25)) == "accuracy 75.0%"
    assert items.loss == "error rate (1 - accuracy)" and items.screened(0) == "item chunk 0's"


def test_a_block_study_writes_a_one_layer_block_as_a_block():
    words = Replicates(blocks=True)
    assert words.shown("1,1,3,1") == "block:2-2:3" and words.named("1,1,1,1") == "the plain model"
