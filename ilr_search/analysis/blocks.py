"""The (start, end) grid of a block search: every block map `block:I-J:R` a study has a result for, as its loss
difference to the plain model (the all-ones map) on held-out text. Where the race compared the block with the plain
model, the cell is that comparison (its paired mean difference over the test chunks, its interval and status);
elsewhere it is the block's result on the screening chunk (chunk 0, where the trials were scored) minus the plain
model's there. A block of one layer is its reuse map (`1,1,2,1` is block 2-2 run twice) and sits on the diagonal;
knobs (damping) make panels of their own. The figure (plots.py) and `pareto --view blocks` draw this grid."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ilr_search.analysis.race_core import DECIDED_AGAINST, Comparison, RaceSettings
from ilr_search.records import record_json
from ilr_search.storage.store import Run
from ilr_search.training.schedule import Map

CLAIMED = "better"  # the comparison status of a block claimed better than the plain model
NOT_RACED = "not raced"  # the status of a cell the race did not compare: its screening result alone
RACED, SCREEN, PROXY = "raced", "chunk0", "proxy"  # where a cell's difference comes from (BlockCell.source)

# A cell's decision, as the terminal marks it (the figure draws the same three with markers)
MARKS = {"claimed": "*", "against": "x", "undecided": "~", "": " "}
MARKS_LINE = (
    "* claimed better than the plain model (paired test); x decided against (cannot win, dominated, worse, "
    "diverged); ~ raced, undecided; no mark: screened only"
)
CLIP_SPREADS = 3.0  # the colour scale is clipped at this many median absolute differences (colour_limit)


@dataclass(frozen=True)
class BlockPlace:
    """Where a map key sits in the grid: its block's first and last layer (0-based, inclusive), its repeats and its
    knobs ('' when every knob is off)."""

    start: int
    end: int
    repeats: int
    knobs: str


def block_place(map_key: str, n_layers: int) -> BlockPlace | None:
    """The place of a map key that is one block run more than once (`block:I-J:R`, or a reuse map with one layer run
    R > 1 times, block I-I); None for the plain model and for reuse maps that are no single block."""
    chosen = Map.parse(map_key, n_layers)
    block = chosen.one_block()
    if block is None or block.repeats < 2:
        return None
    return BlockPlace(block.start, block.end, block.repeats, chosen.knobs)


@dataclass(frozen=True)
class BlockCell:
    """One block's cell: its place, map key and FLOPs ratio; `diff`, its loss minus the plain model's (in the loss's
    unit: nats, or for items the error rate; negative: the block is better; None: it diverged); `interval`, the
    race's interval of that difference (None where not raced); `status`, the race's comparison status (race_core's
    COMPARISON_STATUSES) or NOT_RACED; `source`, RACED (the comparison, paired over `chunks`, `units` windows or
    items) or the screening result (SCREEN: chunk `chunks[0]` of a frozen study; PROXY: the proxy trial of a trained
    one)."""

    start: int
    end: int
    repeats: int
    knobs: str
    map_key: str
    flops_ratio: float
    diff: float | None
    interval: tuple[float, float] | None
    status: str
    source: str
    chunks: tuple[int, ...]
    units: int = 0

    @property
    def decision(self) -> str:
        """claimed (better), against (DECIDED_AGAINST), undecided (raced, still open or spent), or '' (not raced)."""
        if self.status == CLAIMED:
            return "claimed"
        if self.status in DECIDED_AGAINST:
            return "against"
        return "undecided" if self.source == RACED else ""

    @property
    def mark(self) -> str:
        return MARKS[self.decision]

    def to_dict(self) -> dict[str, Any]:
        return record_json(self, names={"map_key": "map"}, knobs=self.knobs or None)


@dataclass(frozen=True)
class BlockPanel:
    """The cells of one repeat count and knob setting."""

    repeats: int
    knobs: str
    cells: tuple[BlockCell, ...]

    @property
    def title(self) -> str:
        """`R = 2` (`R = 2, damping=0.5` with knobs on)."""
        return f"R = {self.repeats}" + (f", {self.knobs}" if self.knobs else "")

    def cell(self, start: int, end: int) -> BlockCell | None:
        return next((c for c in self.cells if c.start == start and c.end == end), None)


@dataclass(frozen=True)
class BlockGrid:
    """A block study's grid: the model's `n_layers`, the plain model's key, its loss on the screening chunk
    (`plain_loss`, what the screened cells are differences to) and its perplexity (`plain_ppl`: of its mean loss
    over its results at the race's decided length, as the race's verdict states gains), the race's settings (what
    is judged, its confidence, its words for a chunk or a seed), and the cells, one per block map with a result."""

    n_layers: int
    baseline: str
    plain_loss: float | None
    plain_ppl: float | None
    settings: RaceSettings
    cells: tuple[BlockCell, ...]

    @property
    def screen_chunk(self) -> int:
        """The chunk (a trained study: the seed) the trials were scored on."""
        return self.settings.seeds[0]

    @property
    def unit(self) -> str:
        """The unit of a difference: nats of loss, or for items the share of items wrong."""
        return "error rate" if self.settings.judged == "accuracy" else "nats"

    def panels(self) -> list[BlockPanel]:
        """One panel per (repeats, knobs), every knob off first, then by repeats; cells by start, then end."""
        keys = sorted({(c.knobs, c.repeats) for c in self.cells}, key=lambda k: (k[0] != "", k[0], k[1]))
        return [
            BlockPanel(
                repeats,
                knobs,
                tuple(
                    sorted(
                        (c for c in self.cells if c.repeats == repeats and c.knobs == knobs),
                        key=lambda c: (c.start, c.end),
                    )
                ),
            )
            for knobs, repeats in keys
        ]

    def ppl_diff(self, diff: float) -> float | None:
        """A loss difference as perplexity at the plain model's (map minus plain), where perplexity is judged."""
        if self.settings.judged != "ppl" or self.plain_ppl is None:
            return None
        return self.plain_ppl * math.expm1(diff)

    def colour_limit(self) -> float:
        """The colour scale's half-range: CLIP_SPREADS median absolute differences, at most the largest one, so that
        a catastrophe (a block many nats worse) saturates and the rest keep their shades."""
        sizes = [abs(c.diff) for c in self.cells if c.diff is not None and math.isfinite(c.diff)]
        if not sizes or max(sizes) == 0:
            return 1.0
        spread = statistics.median(sizes)
        return min(max(sizes), CLIP_SPREADS * spread) if spread > 0 else max(sizes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_layers": self.n_layers,
            "plain": self.baseline,
            "plain_loss": self.plain_loss,
            "plain_ppl": self.plain_ppl,
            "unit": self.unit,
            "screen_chunk": self.screen_chunk,
            "confidence": self.settings.confidence,
            "colour_limit": self.colour_limit(),
            "cells": [c.to_dict() for c in sorted(self.cells, key=lambda c: (c.knobs, c.repeats, c.start, c.end))],
        }


def block_grid(
    results: Sequence[Run],
    comparisons: Sequence[Comparison],
    n_layers: int,
    baseline: str,
    settings: RaceSettings,
) -> BlockGrid:
    """The grid of a study's stored results (one per map, steps and seed, as the race reads them) and the race's
    comparisons with the plain model `baseline`: each block with a comparison is that comparison's cell (RACED);
    each other block with a result at the proxy's length on the screening chunk (settings.seeds[0]: where the
    trials were scored) is that result's loss minus the plain model's there. The plain model's perplexity is of its
    mean loss over its results at the race's target length."""
    base_steps, chunk = settings.base_steps, settings.seeds[0]
    screened = {r.map_key: r for r in results if r.steps == base_steps and r.seed == chunk}
    plain = screened.get(baseline)
    plain_loss = plain.val_loss if plain is not None else None
    plain_losses = [
        r.val_loss for r in results if r.map_key == baseline and r.steps == settings.target_steps and r.val_loss
    ]
    plain_ppl = math.exp(math.fsum(plain_losses) / len(plain_losses)) if plain_losses else None
    compared = {c.map_key: c for c in comparisons}
    flops = {r.map_key: r.flops_ratio for r in results}
    cells = []
    for key in sorted(set(screened) | set(compared)):
        place = block_place(key, n_layers)
        if place is None:
            continue
        c = compared.get(key)
        measured: tuple[float, float | None, tuple[float, float] | None, str, str, tuple[int, ...], int]
        if c is not None and c.mean_diff is not None:
            measured = (c.flops_ratio, c.mean_diff, c.interval, c.status, RACED, c.seeds, c.units)
        else:
            r = screened.get(key)
            loss = r.val_loss if r is not None else None
            diff = loss - plain_loss if loss is not None and plain_loss is not None else None
            status = c.status if c is not None else NOT_RACED if loss is not None else "diverged"
            flops_ratio = flops.get(key, c.flops_ratio if c is not None else math.nan)
            measured = (flops_ratio, diff, None, status, SCREEN if settings.frozen else PROXY, (chunk,), 0)
        cells.append(BlockCell(place.start, place.end, place.repeats, place.knobs, key, *measured))
    return BlockGrid(n_layers, baseline, plain_loss, plain_ppl, settings, tuple(cells))
