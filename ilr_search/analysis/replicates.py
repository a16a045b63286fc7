"""What a study's results are replicates of, chosen once when the study is opened: trained maps (a replicate is a
training seed, a result stands at a length in steps) or frozen maps (pretrained weights, no step trained: a replicate
is a chunk of held-out windows or of task items). The printers, the reports and the figures ask it for their words,
their score column and what they show, instead of testing a flag."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol

from ilr_search.training.schedule import as_block, is_baseline_key, shown_key

Judged = Literal["ppl", "answer", "accuracy"]  # what a study judges: perplexity, answer loss, accuracy on items
FROZEN_UNITS = ("window chunk", "item chunk")  # a frozen study's replicates
SCORE_COLUMNS = ("ppl", "answer loss", "accuracy %")  # the score column of a study, by what it judges


class Evaluated(Protocol):
    """What a study's race settings say of its evaluation (race_core.RaceSettings)."""

    @property
    def frozen(self) -> bool: ...
    @property
    def items(self) -> bool: ...
    @property
    def judged(self) -> Judged: ...
    @property
    def blocks(self) -> bool: ...


@dataclass(frozen=True)
class Replicates:
    """How a study's results are made and said: `frozen` (evaluated on pretrained weights, on chunks of held-out
    windows, or of task items where `items`) or trained (on seeds, at a length); `judged`: the score (perplexity,
    answer loss, accuracy on items: race_core.Measure); `blocks`: the study searches blocks only (a one-layer block
    written block:I-I:R)."""

    frozen: bool = False
    items: bool = False
    judged: Judged = "ppl"
    blocks: bool = False

    @classmethod
    def of(cls, settings: Evaluated | None) -> Replicates:
        """A study's, from its race settings (a study with no race: trained, judged by perplexity)."""
        if settings is None:
            return cls()
        return cls(settings.frozen, settings.items, settings.judged, settings.blocks)

    # -- a replicate and a length -------------------------------------------------------------------------------

    @property
    def unit(self) -> str:
        """One replicate of a map, in the singular: a training seed, or a chunk of held-out windows or items."""
        if self.frozen:
            return FROZEN_UNITS[1] if self.items else FROZEN_UNITS[0]
        return "seed"

    @property
    def plural(self) -> str:
        return f"{self.unit}s"

    @property
    def paired(self) -> str:
        """What a frozen study's differences are paired by: "window" or "item"."""
        return "item" if self.items else "window"

    @property
    def chunk_of(self) -> str:
        """What a frozen study's chunk holds: "held-out windows" or "task items"."""
        return "task items" if self.items else "held-out windows"

    def at(self, steps: int) -> str:
        """Where a result stands: "at 2000 steps", or a frozen study's "on held-out windows" (or items)."""
        if self.frozen:
            return "on held-out items" if self.items else "on held-out windows"
        return f"at {steps} steps"

    def count(self, n: int, test: bool = False) -> str:
        """`n` seeds (or window chunks); `test`: of the race's test ones."""
        return f"{n} {'test ' if test else ''}{self.unit}{'s' if n != 1 else ''}"

    def one(self, seed: int) -> str:
        return f"{self.unit} {seed}"

    def where(self, steps: int, seed: int) -> str:
        """Where a race run is: "at 2000 steps, seed 3", or a frozen study's "on window chunk 3"."""
        return f"on {self.one(seed)}" if self.frozen else f"at {steps} steps, seed {seed}"

    # -- what a study does to a map -----------------------------------------------------------------------------

    @property
    def trains(self) -> bool:
        """Whether its maps are trained: only then has it learning curves, a proxy's fidelity and a live front."""
        return not self.frozen

    @property
    def map(self) -> str:
        """What its study counts: a "trial" (trained), or a "map" (evaluated)."""
        return "map" if self.frozen else "trial"

    @property
    def maps(self) -> str:
        return f"{self.map}s"

    @property
    def verb(self) -> str:
        """What it does to a map: "train" or "evaluate"."""
        return "evaluate" if self.frozen else "train"

    @property
    def finished(self) -> str:
        return "maps evaluated" if self.frozen else "trials finished"

    def doing(self, named: str) -> str:
        """What a trial does to its map: "training map 2,1" or "evaluating map 2,1 on window chunk 0"."""
        return f"evaluating {named} on {self.one(0)}" if self.frozen else f"training {named}"

    def screened(self, chunk: int) -> str:
        """Whose result a map has where the race did not test it: "the proxy trial's", or "window chunk 0's"."""
        return f"{self.one(chunk)}'s" if self.frozen else "the proxy trial's"

    @property
    def screen(self) -> str:
        """Its trials' front in a figure: the proxy's, or a frozen study's screening chunk's."""
        return "Pareto front of the screen" if self.frozen else "proxy Pareto front"

    @property
    def screen_axis(self) -> str:
        """The perplexity axis of its trials' panel."""
        return "perplexity on the screening chunk" if self.frozen else "validation perplexity"

    @property
    def held_out(self) -> str:
        """What a block's colour is the difference of: "held-out loss" (frozen) or "loss"."""
        return "held-out loss" if self.frozen else "loss"

    @property
    def loss(self) -> str:
        """What a unit's loss is: the loss, or for accuracy on items the error rate."""
        return "error rate (1 - accuracy)" if self.judged == "accuracy" else "loss"

    # -- a map and a score --------------------------------------------------------------------------------------

    def shown(self, map_key: str) -> str:
        """A map key as output shows it: `plain` for the plain model, a one-layer block as block:I-I:R in a study of
        blocks, any other as the study writes it."""
        return shown_key(as_block(map_key) if self.blocks else map_key)

    def named(self, map_key: str) -> str:
        """A map as a line of output names it: `map KEY`, or `the plain model` (not its L ones)."""
        if is_baseline_key(map_key):
            return "the plain model"
        return f"map {self.shown(map_key)}"

    def value(self, val_ppl: float | None) -> float | None:
        """A result's score in its measure: ppl, the answer loss (nats), or the accuracy (%, from the error rate
        that val_ppl is the exponential of)."""
        if val_ppl is None or val_ppl <= 0:
            return None
        if self.judged == "accuracy":
            return 100.0 * (1.0 - math.log(val_ppl))
        return math.log(val_ppl) if self.judged == "answer" else val_ppl

    @property
    def column(self) -> str:
        return dict(zip(("ppl", "answer", "accuracy"), SCORE_COLUMNS, strict=True))[self.judged]

    def score(self, val_ppl: float | None) -> str:
        """`ppl 12.34`, `answer loss 0.8123`, `accuracy 41.7%`."""
        value = self.value(val_ppl)
        if value is None:
            return f"{self.column.split(' %')[0]} -"
        if self.judged == "accuracy":
            return f"accuracy {value:.1f}%"
        return f"{self.column} {value:.4g}"
