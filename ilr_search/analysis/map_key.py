"""The one key a study dedupes, claims and compares its results on: a map with its knob settings.

Its text is `2,1,1,1` (every knob off), `2,1,1,1|injection=add` (knobs.config_key writes it, in knobs.format_knobs'
order) or a block map `block:1-2:2` with or without knobs. MapKey parses it once, through schedule.py's map_of_key
(the one parser of a map's text), so that no reader splits the text by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ilr_search.training.schedule import PLAIN_TEXT, BlockMap, Map, ReuseMap, ScheduleError, is_block_text, map_of_key

KNOB_SEPARATOR = "|"


def map_text(map_key: str) -> str:
    """The map of a study's map key, without its knobs: "2,1,1,1" or "block:1-2:2"."""
    return map_key.partition(KNOB_SEPARATOR)[0]


def as_block(map_key: str) -> str:
    """A key as a study of blocks writes it: a reuse map that repeats one layer only (`1,1,2,1`, the canonical key
    of the block of that layer) as that block (`block:2-2:2`), its knobs kept; any other key as it is."""
    text, _, knobs = map_key.partition(KNOB_SEPARATOR)
    if is_block_text(text):
        return map_key
    try:
        chosen = MapKey.parse(map_key).map
    except ScheduleError:  # no reuse map (the race's deepN, blockK): shown as it is
        return map_key
    repeated = [i for i, c in enumerate(chosen.counts) if c > 1]
    if len(repeated) != 1:
        return map_key
    i, n = repeated[0], len(chosen.counts)
    return key_text(BlockMap(i, i, chosen.counts[i], n, chosen.parts[i] if chosen.parts else "").key, knobs)


def shown_key(map_key: str) -> str:
    """A map key as output shows it: `plain` for the plain model (not its L ones), any other key as it is."""
    return PLAIN_TEXT if is_baseline_key(map_key) else map_key


def is_baseline_key(map_key: str) -> bool:
    """The paper's baseline: the all-ones map with every knob off. A key that is no map (the race's equal-compute
    `deepN`, block recurrence `blockK`) is not it."""
    if is_block_text(map_key):
        return False
    try:
        return MapKey.parse(map_key).is_baseline
    except ScheduleError:
        return False


def key_text(map_text: str, knobs: str | None = None) -> str:
    """The key of a map's text (`2,1,1,1`, `block:1-2:2`) and its knob text (None or '': every knob off)."""
    return f"{map_text}{KNOB_SEPARATOR}{knobs}" if knobs else map_text


def key_layers(map_key: str, n_layers: int | None = None) -> int:
    """The model's layers a map key is parsed against: `n_layers` where given, else a reuse map's count of entries
    (a block map's key does not say them: it needs `n_layers`)."""
    if n_layers is not None:
        return n_layers
    text = map_text(map_key)
    if is_block_text(text):
        raise ValueError(f"the counts of block map {text!r} need the number of layers")
    return text.count(",") + 1


@dataclass(frozen=True)
class MapKey:
    """map: the parsed map (a ReuseMap or a BlockMap); knobs: the knobs that are on, as knobs.format_knobs writes
    them ('' when every knob is off)."""

    map: Map
    knobs: str = ""

    @classmethod
    def parse(cls, key: str, n_layers: int | None = None) -> MapKey:
        """A stored key, parsed for a model of `n_layers` layers (needed for a block map; a reuse map's entries give
        it otherwise)."""
        knobs = key.partition(KNOB_SEPARATOR)[2]
        return cls(map_of_key(key, key_layers(key, n_layers)), knobs)

    @classmethod
    def of(cls, counts: Sequence[int], knobs: str | None = None) -> MapKey:
        """The key of a row's reuse map and knob text (None or '': every knob off)."""
        return cls(ReuseMap(tuple(counts)), knobs or "")

    @property
    def key(self) -> str:
        return key_text(self.map.key, self.knobs)

    def __str__(self) -> str:
        return self.key

    @property
    def is_baseline(self) -> bool:
        """The paper's baseline: the all-ones map with every knob off."""
        return self.map.is_baseline and not self.knobs
