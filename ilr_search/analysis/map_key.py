"""The one key a study dedupes, claims and compares its results on: a map with its knob settings.

Its text is `2,1,1,1` (every knob off) or `2,1,1,1|injection=add` (knobs.config_key writes it, in knobs.format_knobs'
order). MapKey parses it once, so that no reader splits the text by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ilr_search.training.schedule import ReuseMap

KNOB_SEPARATOR = "|"


@dataclass(frozen=True)
class MapKey:
    """map: the parsed map (a ReuseMap); knobs: the knobs that are on, as knobs.format_knobs writes them ('' when
    every knob is off)."""
    map: ReuseMap
    knobs: str = ""

    @classmethod
    def parse(cls, key: str) -> MapKey:
        """A stored key (not checked against a model: it was checked when the map was trained)."""
        text, _, knobs = key.partition(KNOB_SEPARATOR)
        return cls(ReuseMap(tuple(int(x) for x in text.split(","))), knobs)

    @classmethod
    def of(cls, counts: Sequence[int], knobs: str | None = None) -> MapKey:
        """The key of a row's map and knob text (None or '': every knob off)."""
        return cls(ReuseMap(tuple(counts)), knobs or "")

    @property
    def key(self) -> str:
        return f"{self.map.key}{KNOB_SEPARATOR}{self.knobs}" if self.knobs else self.map.key

    def __str__(self) -> str:
        return self.key

    @property
    def is_baseline(self) -> bool:
        """The paper's baseline: the all-ones map with every knob off."""
        return self.map.is_baseline and not self.knobs
