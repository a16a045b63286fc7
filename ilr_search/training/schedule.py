"""Reuse maps, block maps and block recurrence as execution schedules (lists of layer indices). `ReuseMap` and
`BlockMap` are the value types and `parse_map` the one parser of a map's text; the functions below take and give
plain lists of counts, as most of the package still passes them."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ilr_search.config import ModelConfig
from ilr_search.errors import UserInputError
from ilr_search.knobs import KnobValue, acting_knobs, parse_knob_settings


class ScheduleError(UserInputError):
    """A reuse map or block count that cannot be run."""


# One entry of a reuse map: R (the whole layer R times), Ra (its attention R times, then its MLP once) or Rm (its
# attention once, then its MLP R times).
ENTRY_TEXT = re.compile(r"(\d+)([am]?)")
PLAIN_TEXT = "plain"  # the plain model (every layer once), as a person may write it


def branch_pass(part: str, repeat: int) -> tuple[int, int]:
    """The pass index of each branch (attention's, MLP's) at a layer's pass `repeat`, where it runs: a whole layer's
    branches both take the layer's; a one-branch layer's other branch runs once (index 0)."""
    return (repeat if part != "m" else 0, repeat if part != "a" else 0)


def part_passes(part: str, repeats: int) -> list[tuple[int | None, int | None]]:
    """Each of a layer's `repeats` passes: the pass index (branch_pass) of each branch (attention, MLP) that runs,
    None for one that does not. "" both every pass; "a" attention every pass, the MLP in the last only (3a: attn,
    attn, attn then MLP); "m" attention in the first pass only, the MLP every pass (3m: attn then MLP, MLP, MLP).
    The one rule of per-layer entries and blocks."""
    out: list[tuple[int | None, int | None]] = []
    for k in range(repeats):
        attn, mlp = branch_pass(part, k)
        out.append((attn if part != "m" or k == 0 else None, mlp if part != "a" or k == repeats - 1 else None))
    return out


def layer_parts(counts: Sequence[int], parts: Sequence[str]) -> tuple[str, ...]:
    """The parts as a model config holds them (ModelConfig.parts): a layer run once is whole, and a map with no
    one-branch layer has none: ()."""
    kept = tuple(p if r > 1 else "" for r, p in zip(counts, parts, strict=False))
    return kept if any(kept) else ()


@dataclass(frozen=True)
class ReuseMap:
    """How many times in a row each layer runs, and which of its branches repeat: `4,2,1,1`, `1,3a,1,2m`. Its text
    form is also its key in a study (the map key of a trial with every knob off); the baseline runs every layer
    once. `parts` (per layer, "" / "a" / "m"; () where every layer is whole) says which branch a repeated layer's
    passes run (part_passes); `1a`, `1m` and `1` are the same plain layer."""

    counts: tuple[int, ...]
    parts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", layer_parts(self.counts, self.parts))

    @classmethod
    def parse(cls, text: str, n_layers: int) -> ReuseMap:
        """`"4,2,1,1"` or `"1,3a,1,2m"` (or `plain`), checked against the number of layers (and every count at
        least 1)."""
        if str(text).strip() == PLAIN_TEXT:
            return cls.baseline(n_layers)
        entries = [ENTRY_TEXT.fullmatch(p.strip()) for p in str(text).split(",")]
        if any(e is None for e in entries):
            raise ScheduleError(
                f"reuse map {text!r} must be one entry per layer, comma-separated, each R (the layer R times), Ra "
                "(its attention R times, then its MLP) or Rm (its attention, then its MLP R times), e.g. 2,1,3a,1"
            )
        matched = [e for e in entries if e is not None]
        return cls(tuple(int(e.group(1)) for e in matched), tuple(e.group(2) for e in matched)).checked(n_layers)

    @classmethod
    def baseline(cls, n_layers: int) -> ReuseMap:
        return cls((1,) * n_layers)

    def checked(self, n_layers: int, max_reuse: int | None = None) -> ReuseMap:
        """This map, if a model of `n_layers` layers can run it (and no layer runs more than `max_reuse` times)."""
        check_reuse_map(self.counts, n_layers)
        if max_reuse is not None:
            check_max_reuse(self.counts, max_reuse, f"reuse map {self}")
        return self

    @property
    def key(self) -> str:
        parts = self.parts or ("",) * len(self.counts)
        return ",".join(f"{r}{p}" for r, p in zip(self.counts, parts, strict=True))

    def __str__(self) -> str:
        return self.key

    @property
    def is_baseline(self) -> bool:
        return bool(self.counts) and all(r == 1 for r in self.counts)

    @property
    def layer_runs(self) -> int:
        """The layers the map runs in one forward pass (its depth of compute; a one-branch pass counts as one)."""
        return sum(self.counts)

    def schedule(self) -> list[int]:
        """Layer l runs counts[l] times in a row: 2,1,1 -> [0, 0, 1, 2]."""
        return [layer for layer, count in enumerate(self.counts) for _ in range(count)]

    def configure(self, cfg: ModelConfig) -> ModelConfig:
        """`cfg` running this map's parts (ModelConfig.parts): the schedule gives the order, the config the branches."""
        return cfg if cfg.parts == self.parts else dataclasses.replace(cfg, parts=self.parts)


BLOCK_PREFIX = "block:"
BLOCK_TEXT = re.compile(r"block:(\d+)-(\d+):(\d+)([am]?)")


@dataclass(frozen=True)
class BlockMap:
    """One contiguous block of layers run `repeats` times as a block, every other layer once: `block:1-2:2` on 4
    layers runs [0, 1, 2, 1, 2, 3]. Layers are counted from 0, `start` and `end` both inclusive. Its text form is
    its key in a study. `part` "a" or "m" (`block:1-2:3a`) runs the block's layers by part_passes as a layer of
    that part would: with "a", every pass but the last runs each layer's attention only; with "m", every pass but
    the first runs each layer's MLP only. A block of one layer, or one run once, has the same schedule as a reuse
    map (`block:2-2:3a` = `1,1,3a,1`, `block:1-2:1` = the baseline): `canonical()` (and `parse_map`) gives that
    reuse map instead, so that one schedule has one key."""

    start: int
    end: int
    repeats: int
    n_layers: int
    part: str = ""

    @classmethod
    def parse(cls, text: str, n_layers: int) -> BlockMap:
        """`"block:I-J:R"`, checked against the number of layers (not made canonical: see parse_map)."""
        match = BLOCK_TEXT.fullmatch(str(text).strip())
        if match is None:
            raise ScheduleError(
                f"block map {text!r} must be block:I-J:R (layers I..J, counted from 0, run R times "
                "as a block), e.g. block:1-2:2"
            )
        start, end, repeats = (int(g) for g in match.groups()[:3])
        return cls(start, end, repeats, n_layers, match.group(4)).checked(n_layers)

    def checked(self, n_layers: int, max_reuse: int | None = None) -> BlockMap:
        """This block, if a model of `n_layers` layers can run it (and no layer runs more than `max_reuse` times)."""
        if n_layers != self.n_layers:
            raise ScheduleError(f"block map {self} is for {self.n_layers} layers but the model has {n_layers}")
        if self.start > self.end:
            raise ScheduleError(f"block map {self}: the block's first layer {self.start} is after its last {self.end}")
        if self.end >= n_layers:
            raise ScheduleError(
                f"block map {self}: layer {self.end} does not exist; the model has {n_layers} layers "
                f"(0..{n_layers - 1})"
            )
        if self.repeats < 1:
            raise ScheduleError(f"block map {self}: the block runs at least once (R >= 1), got {self.repeats}")
        if max_reuse is not None:
            check_max_reuse(self.counts, max_reuse, f"block map {self}")
        return self

    def canonical(self) -> ReuseMap | BlockMap:
        """The reuse map of the same schedule where there is one (a block of one layer, or run once); else self."""
        if self.start == self.end or self.repeats == 1:
            return ReuseMap(self.counts, self.parts)
        return self

    @property
    def key(self) -> str:
        return f"{BLOCK_PREFIX}{self.start}-{self.end}:{self.repeats}{self.part if self.repeats > 1 else ''}"

    def __str__(self) -> str:
        return self.key

    @property
    def length(self) -> int:
        """The layers in the block."""
        return self.end - self.start + 1

    @property
    def counts(self) -> tuple[int, ...]:
        """How many times each layer runs (not in which order: the schedule gives that)."""
        return tuple(self.repeats if self.start <= i <= self.end else 1 for i in range(self.n_layers))

    @property
    def parts(self) -> tuple[str, ...]:
        """Each layer's part, as ModelConfig.parts holds them."""
        in_block = [self.start <= i <= self.end for i in range(self.n_layers)]
        return layer_parts(self.counts, [self.part if inside else "" for inside in in_block])

    @property
    def is_baseline(self) -> bool:
        return self.repeats == 1

    @property
    def layer_runs(self) -> int:
        return self.n_layers + self.length * (self.repeats - 1)

    def configure(self, cfg: ModelConfig) -> ModelConfig:
        """`cfg` running this block's parts (ModelConfig.parts)."""
        return cfg if cfg.parts == self.parts else dataclasses.replace(cfg, parts=self.parts)

    def schedule(self) -> list[int]:
        """[0..I-1] + [I..J] * R + [J+1..L-1]."""
        block = list(range(self.start, self.end + 1))
        return list(range(self.start)) + block * self.repeats + list(range(self.end + 1, self.n_layers))


Map = ReuseMap | BlockMap  # a map a trial trains, as parse_map gives it


def is_block_text(text: str) -> bool:
    """Written as a block map (`block:...`), not as per-layer counts or block recurrence `blockK`."""
    return str(text).strip().startswith(BLOCK_PREFIX)


def parse_map(text: str, n_layers: int) -> Map:
    """A map as a person or a study's key writes it: `4,2,1,1` (a reuse map) or `block:1-2:2` (a block map),
    checked against the number of layers and made canonical (a block with the schedule of a reuse map is that
    reuse map). The one parser of every place that takes a map."""
    if is_block_text(text):
        return BlockMap.parse(text, n_layers).canonical()
    return ReuseMap.parse(text, n_layers)


def parse_keyed_map(text: str, n_layers: int, where: str) -> tuple[Map, dict[str, KnobValue]]:
    """A map with its knob settings as a person writes it (`block:16-27:2|damping=0.5`, `2,1,1,1`): the map
    (parse_map) and the knobs that act on it (knobs.parse_knob_settings, acting_knobs); one error line naming `where`
    for either's fault."""
    map_text, _, knob_text = text.partition("|")
    try:
        chosen = parse_map(map_text, n_layers)
        knobs = parse_knob_settings(knob_text) if knob_text.strip() else {}
    except ValueError as e:  # ScheduleError is a UserInputError; knob errors are ValueErrors
        raise ScheduleError(f"{where}: {e}") from None
    return chosen, acting_knobs(knobs, chosen.schedule())


def map_of_key(map_key: str, n_layers: int) -> Map:
    """The map of a study's map key (`2,1,1,1`, `block:1-2:2`, either with `|knob=...` after it)."""
    return parse_map(map_key.split("|", 1)[0], n_layers)


def map_of_schedule(schedule: Sequence[int], n_layers: int) -> Map | None:
    """The map whose schedule this is (canonical, as parse_map gives it): a reuse map's (each layer's runs in a
    row, in order) or one block's ([0..I-1] + [I..J] * R + [J+1..L-1]); None for a schedule that is neither."""
    counts = [0] * n_layers
    for layer in schedule:
        if not 0 <= layer < n_layers:
            return None
        counts[layer] += 1
    if min(counts, default=0) < 1:
        return None
    as_counts = ReuseMap(tuple(counts))
    if as_counts.schedule() == list(schedule):
        return as_counts
    repeated = [i for i, r in enumerate(counts) if r > 1]
    if not repeated:  # every layer once, out of order
        return None
    block = BlockMap(repeated[0], repeated[-1], counts[repeated[0]], n_layers)
    return block.canonical() if block.schedule() == list(schedule) else None


def check_reuse_map(reuse_map: Sequence[int], n_layers: int) -> None:
    if len(reuse_map) != n_layers:
        raise ScheduleError(
            f"reuse map {format_reuse_map(reuse_map)} has {len(reuse_map)} entries but the model has "
            f"{n_layers} layers; give one count per layer or change --layers"
        )
    if any(r < 1 for r in reuse_map):
        raise ScheduleError(
            f"reuse map {format_reuse_map(reuse_map)} has a count below 1; every layer runs at least once"
        )


def check_max_reuse(reuse_map: Sequence[int], max_reuse: int, where: str) -> None:
    """No layer of the map runs more than the space's [search] max_reuse times: the one rule of `run --enqueue`,
    `flops` and `train` (`where` names the map in the message)."""
    if max(reuse_map) > max_reuse:
        raise ScheduleError(
            f"{where}: a layer runs {max(reuse_map)} times, above the space's max_reuse {max_reuse} "
            "([search] max_reuse)"
        )


def format_reuse_map(reuse_map: Sequence[int]) -> str:
    return ReuseMap(tuple(reuse_map)).key


def reuse_map_schedule(reuse_map: Sequence[int]) -> list[int]:
    """Layer l runs reuse_map[l] times in a row: [2, 1, 1] -> [0, 0, 1, 2]."""
    return ReuseMap(tuple(reuse_map)).schedule()


def block_schedule(n_layers: int, k: int) -> list[int]:
    """The whole stack run k times: (4, 2) -> [0, 1, 2, 3, 0, 1, 2, 3]."""
    if k < 1:
        raise ScheduleError(f"--block must be a positive integer, got {k}")
    return list(range(n_layers)) * k


def resolve_schedule(
    n_layers: int, reuse_map: str | Sequence[int] | None = None, block: int | None = None, max_reuse: int | None = None
) -> tuple[list[int], list[int], int | None]:
    """(reuse_map, schedule, block) from either a map (a reuse map, or a block map's text `block:I-J:R`, whose
    reuse map is its per-layer counts) or a block count; neither means the all-ones map. With `max_reuse` (the
    space's), a map with a layer run more often than that is refused.

    For block recurrence the reuse map lists how often each layer runs (K each); the schedule gives the order.
    """
    if reuse_map is not None and block is not None:
        raise ScheduleError("give either --reuse-map or --block, not both")
    if block is not None:
        if block >= 1 and max_reuse is not None:  # before the schedule is built: a huge K is refused, not allocated
            check_max_reuse([block], max_reuse, f"--block {block}")
        return [block] * n_layers, block_schedule(n_layers, block), block
    chosen: Map
    if reuse_map is None:
        chosen = ReuseMap.baseline(n_layers)
    elif isinstance(reuse_map, str):
        chosen = parse_map(reuse_map, n_layers)
    else:
        chosen = ReuseMap(tuple(reuse_map)).checked(n_layers)
    chosen.checked(n_layers, max_reuse)
    return list(chosen.counts), chosen.schedule(), None
