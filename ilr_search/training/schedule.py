"""The map a trial trains, as one value type: `Map`, whose one parser `Map.parse` reads every form a person or a
study's key writes, and whose text (`str(map)`) is that key again. The functions below turn a map into the
execution schedule (the list of layer indices a forward pass runs) and take and give plain lists of counts where
the package passes them."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ilr_search.config import ModelConfig
from ilr_search.errors import UserInputError
from ilr_search.knobs import KnobValue, acting_knobs, format_knobs, parse_knob_settings


class ScheduleError(UserInputError):
    """A map that cannot be run, or text that is no map."""


# One entry of a per-layer map: R (the whole layer R times), Ra (its attention R times, then its MLP once) or Rm (its
# attention once, then its MLP R times).
ENTRY_TEXT = re.compile(r"(\d+)([am]?)")
BLOCK_TEXT = re.compile(r"block:(\d+)-(\d+):(\d+)([am]?)")
STACK_TEXT = re.compile(r"block(\d+)([am]?)")
DEEPER_TEXT = re.compile(r"deep(\d+)")
PLAIN_TEXT = "plain"  # the plain model (every layer once), as a person may write it and output shows it
KNOB_SEPARATOR = "|"  # map text | knob settings

# The forms of a map: per-layer counts (`4,2,1,1`, `1,3a,1,2m`), one block run as a block (`block:1-2:2`), the whole
# stack K times (`blockK`), and the deeper plain model (`deepN`: the study's model with N layers, each run once,
# the race's equal-compute comparison; no map of the study's model).
MapForm = Literal["layers", "block", "stack", "deeper"]
# What a map is, as Map.kind says it: its form, or `plain` for the plain model (every layer once, every knob off).
MapKind = Literal["plain", "layers", "block", "stack", "deeper"]


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


def block_text(start: int, end: int, repeats: int, part: str = "") -> str:
    """`block:I-J:R` with the block's part where it repeats (`block:1-2:3a`)."""
    return f"block:{start}-{end}:{repeats}{part if repeats > 1 else ''}"


@dataclass(frozen=True)
class Map:
    """A map: how many times each layer runs (`counts`), in what order (`schedule()`), which branch a repeated
    layer's passes run (`parts`, per layer "" / "a" / "m", () where every layer is whole; part_passes), and the
    knobs that are on (`knobs`, as a study's key writes them, '' when every knob is off).

    Its forms (`form`): per-layer counts (`4,2,1,1`, `1,3a,1,2m`: layer l runs counts[l] times in a row; `1a`,
    `1m` and `1` are the same plain layer); a block (`block:1-2:2`: layers `span` = (I, J), counted from 0, both
    inclusive, run R times as a block, every other layer once; `block:1-2:3a` runs the block's layers by
    part_passes as a layer of that part would); the whole stack K times (`block2`); and the deeper plain model
    (`deep6`: a model of 6 layers each run once, the race's equal-compute comparison). `str(map)` is its key in a
    study (`2,1,1,1|injection=add`); Map.parse reads it back to an equal value."""

    counts: tuple[int, ...]
    parts: tuple[str, ...] = ()
    form: MapForm = "layers"
    span: tuple[int, int] | None = None  # a block's first and last layer
    knobs: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", layer_parts(self.counts, self.parts))

    # --- the forms, built --------------------------------------------------------------------------------------

    @classmethod
    def of_counts(cls, counts: Sequence[int], parts: Sequence[str] = ()) -> Map:
        """The per-layer map of these counts (and parts), unchecked."""
        return cls(tuple(counts), tuple(parts))

    @classmethod
    def baseline(cls, n_layers: int) -> Map:
        """The plain model: every layer once."""
        return cls((1,) * n_layers)

    @classmethod
    def of_block(cls, start: int, end: int, repeats: int, n_layers: int, part: str = "") -> Map:
        """Layers start..end run `repeats` times as a block, checked against the number of layers (not made
        canonical: see canonical())."""
        text = block_text(start, end, repeats, part)
        if start > end:
            raise ScheduleError(f"block map {text}: the block's first layer {start} is after its last {end}")
        if end >= n_layers:
            raise ScheduleError(
                f"block map {text}: layer {end} does not exist; the model has {n_layers} layers (0..{n_layers - 1})"
            )
        if repeats < 1:
            raise ScheduleError(f"block map {text}: the block runs at least once (R >= 1), got {repeats}")
        inside = [start <= i <= end for i in range(n_layers)]
        return cls(
            tuple(repeats if i else 1 for i in inside), tuple(part if i else "" for i in inside), "block", (start, end)
        )

    @classmethod
    def of_stack(cls, repeats: int, n_layers: int) -> Map:
        """The whole stack run `repeats` times (`blockK`)."""
        if repeats < 1:
            raise ScheduleError(f"block recurrence blockK runs the stack K >= 1 times, got block{repeats}")
        return cls((repeats,) * n_layers, (), "stack")

    @classmethod
    def of_deeper(cls, n_layers: int) -> Map:
        """The deeper plain model `deepN`: N layers, each run once."""
        return cls((1,) * n_layers, (), "deeper")

    # --- the one parser ----------------------------------------------------------------------------------------

    @staticmethod
    def form_of(text: str) -> MapForm:
        """The form a map's text is written in, read without the model's layers (which a block or the stack needs
        to be parsed)."""
        written = str(text).partition(KNOB_SEPARATOR)[0].strip()
        if written.startswith("block:"):
            return "block"
        if written.startswith("block"):
            return "stack"
        return "deeper" if DEEPER_TEXT.fullmatch(written) else "layers"

    @classmethod
    def parse(cls, text: str, n_layers: int | None = None) -> Map:
        """A map as a person or a study's key writes it, checked against the model's `n_layers` and made canonical
        (a block with the schedule of a per-layer map is that map): `4,2,1,1`, `1,3a,1,2m`, `plain`,
        `block:1-2:2`, `block:1-2:3a`, `block2`, `deep6`, any of them with knob settings after `|`
        (`2,1,1,1|injection=add`: kept as written, as a study's key holds them; `normalised` reads and rewrites
        them as knobs.format_knobs does). Without `n_layers`, per-layer counts give it
        (a block and the stack need it; the deeper model has its own, and is no map of the study's model: `checked`
        refuses it)."""
        written, _, knob_text = str(text).partition(KNOB_SEPARATOR)
        written = written.strip()
        form = cls.form_of(written)
        if form == "deeper":
            chosen = cls.of_deeper(int(written[len("deep") :]))
        elif n_layers is None and (form != "layers" or written == PLAIN_TEXT):
            raise ScheduleError(f"the counts of map {written!r} need the number of layers")
        elif form == "block":
            chosen = cls.parse_block(written, cast_layers(n_layers, written)).canonical()
        elif form == "stack":
            chosen = cls.parse_stack(written, cast_layers(n_layers, written))
        else:
            chosen = cls.parse_counts(written, n_layers)
        return dataclasses.replace(chosen, knobs=knob_text) if knob_text else chosen

    @classmethod
    def parse_counts(cls, text: str, n_layers: int | None) -> Map:
        if text == PLAIN_TEXT:
            return cls.baseline(cast_layers(n_layers, text))
        entries = [ENTRY_TEXT.fullmatch(p.strip()) for p in text.split(",")]
        if any(e is None for e in entries):
            raise ScheduleError(
                f"reuse map {text!r} must be one entry per layer, comma-separated, each R (the layer R times), Ra "
                "(its attention R times, then its MLP) or Rm (its attention, then its MLP R times), e.g. 2,1,3a,1"
            )
        matched = [e for e in entries if e is not None]
        chosen = cls.of_counts([int(e.group(1)) for e in matched], [e.group(2) for e in matched])
        return chosen.checked(len(matched) if n_layers is None else n_layers)

    @classmethod
    def parse_block(cls, text: str, n_layers: int) -> Map:
        match = BLOCK_TEXT.fullmatch(text)
        if match is None:
            raise ScheduleError(
                f"block map {text!r} must be block:I-J:R (layers I..J, counted from 0, run R times "
                "as a block), e.g. block:1-2:2"
            )
        start, end, repeats = (int(g) for g in match.groups()[:3])
        return cls.of_block(start, end, repeats, n_layers, match.group(4))

    @classmethod
    def parse_stack(cls, text: str, n_layers: int) -> Map:
        match = STACK_TEXT.fullmatch(text)
        if match is None:
            raise ScheduleError(f"block recurrence is blockK with K a whole number, e.g. block2, not {text!r}")
        if match.group(2):
            raise ScheduleError(
                f"block recurrence blockK runs whole layers and has no part; write a block map with one, "
                f"block:0-{n_layers - 1}:{match.group(1)}{match.group(2)}"
            )
        return cls.of_stack(int(match.group(1)), n_layers)

    # --- what it is --------------------------------------------------------------------------------------------

    @property
    def text(self) -> str:
        """The map alone, without its knobs: `2,1,1,1`, `block:1-2:2`, `block2`, `deep6`."""
        if self.form == "block":
            return block_text(self.start, self.end, self.repeats, self.part)
        if self.form == "stack":
            return f"block{self.repeats}"
        if self.form == "deeper":
            return f"deep{len(self.counts)}"
        parts = self.parts or ("",) * len(self.counts)
        return ",".join(f"{r}{p}" for r, p in zip(self.counts, parts, strict=True))

    @property
    def key(self) -> str:
        """Its key in a study: the map's text, then `|` and its knobs where any is on."""
        return f"{self.text}{KNOB_SEPARATOR}{self.knobs}" if self.knobs else self.text

    def __str__(self) -> str:
        return self.key

    @property
    def shown(self) -> str:
        """As output shows it: `plain` for the plain model (not its L ones), else its key."""
        return PLAIN_TEXT if self.kind == "plain" else self.key

    @property
    def kind(self) -> MapKind:
        """`plain` for the plain model of the study (every layer once, every knob off), else its form."""
        return "plain" if self.form == "layers" and self.is_baseline and not self.knobs else self.form

    @property
    def is_block(self) -> bool:
        return self.form == "block"

    @property
    def is_stack(self) -> bool:
        return self.form == "stack"

    @property
    def is_deeper(self) -> bool:
        return self.form == "deeper"

    @property
    def is_baseline(self) -> bool:
        """Every layer of the study's model once, whatever the knobs (a block run once too; not the deeper
        model)."""
        return self.form != "deeper" and bool(self.counts) and all(r == 1 for r in self.counts)

    @property
    def n_layers(self) -> int:
        """The layers of the model the map runs."""
        return len(self.counts)

    @property
    def start(self) -> int:
        """A block's first layer (the stack's: 0)."""
        return self.span[0] if self.span is not None else 0

    @property
    def end(self) -> int:
        """A block's last layer (the stack's: the last)."""
        return self.span[1] if self.span is not None else len(self.counts) - 1

    @property
    def repeats(self) -> int:
        """The times a block (or the stack) runs."""
        return self.counts[self.start]

    @property
    def stack_repeats(self) -> int | None:
        """K of the whole stack run K times (`blockK`); None for any other form."""
        return self.repeats if self.form == "stack" else None

    @property
    def part(self) -> str:
        """A block's part ("" / "a" / "m")."""
        return self.parts[self.start] if self.parts else ""

    @property
    def length(self) -> int:
        """The layers in a block."""
        return self.end - self.start + 1

    @property
    def layer_runs(self) -> int:
        """The layers the map runs in one forward pass (its depth of compute; a one-branch pass counts as one)."""
        return sum(self.counts)

    @property
    def knob_settings(self) -> dict[str, KnobValue]:
        """Its knobs as settings (knobs.parse_knob_settings)."""
        return parse_knob_settings(self.knobs) if self.knobs else {}

    # --- what it becomes ---------------------------------------------------------------------------------------

    def schedule(self) -> list[int]:
        """The layers in the order a forward pass runs them: per-layer counts 2,1,1 -> [0, 0, 1, 2]; a block
        [0..I-1] + [I..J] * R + [J+1..L-1]; the stack [0..L-1] * K; the deeper model [0..N-1]."""
        if self.form == "layers" or self.form == "deeper":
            return [layer for layer, count in enumerate(self.counts) for _ in range(count)]
        block = list(range(self.start, self.end + 1))
        return list(range(self.start)) + block * self.repeats + list(range(self.end + 1, len(self.counts)))

    def canonical(self) -> Map:
        """The per-layer map of the same schedule where a block has one (a block of one layer, or run once); else
        itself, so that one schedule has one key."""
        if self.form == "block" and (self.start == self.end or self.repeats == 1):
            return Map(self.counts, self.parts, knobs=self.knobs)
        return self

    def one_block(self) -> Map | None:
        """The block of the same schedule as a per-layer map, where there is one: the baseline (a block run once) or
        a map with one layer run more than once (a block of that layer, with its part and knobs); a block as it
        is; None otherwise."""
        if self.form != "layers":
            return self if self.form == "block" else None
        n = len(self.counts)
        repeated = [i for i, r in enumerate(self.counts) if r > 1]
        if not repeated:
            return dataclasses.replace(Map.of_block(0, n - 1, 1, n), knobs=self.knobs)
        if len(repeated) > 1:
            return None
        i = repeated[0]
        block = Map.of_block(i, i, self.counts[i], n, self.parts[i] if self.parts else "")
        return dataclasses.replace(block, knobs=self.knobs)

    def with_part(self, part: str) -> Map:
        """A block with this part."""
        return Map.of_block(self.start, self.end, self.repeats, len(self.counts), part)

    def with_knobs(self, knobs: dict[str, KnobValue] | str) -> Map:
        """This map with these knobs on (settings, or their text as format_knobs writes it)."""
        return dataclasses.replace(self, knobs=knobs if isinstance(knobs, str) else format_knobs(knobs))

    def normalised(self) -> Map:
        """This map with its knobs read (an unknown knob or setting is a ScheduleError) and written as
        knobs.format_knobs writes them: `injection` as `injection=add`, a knob set off left out."""
        try:
            return self.with_knobs(self.knob_settings) if self.knobs else self
        except ValueError as e:  # a knob's fault
            raise ScheduleError(str(e)) from None

    def acting(self) -> Map:
        """This map with the knobs that act on its schedule (knobs.acting_knobs: a repeat factor on a map that
        repeats nothing is off)."""
        return self.with_knobs(acting_knobs(self.normalised().knob_settings, self.schedule())) if self.knobs else self

    def checked(self, n_layers: int, max_reuse: int | None = None) -> Map:
        """This map, if a model of `n_layers` layers can run it (and no layer runs more than `max_reuse` times)."""
        if self.form == "deeper":
            raise ScheduleError(
                f"{self.text} is the race's deeper plain model ({len(self.counts)} layers, each once), no map of "
                f"a model of {n_layers} layers"
            )
        if self.form == "layers" and len(self.counts) != n_layers:
            raise ScheduleError(
                f"reuse map {self.text} has {len(self.counts)} entries but the model has {n_layers} layers; give one "
                "count per layer or change --layers"
            )
        if self.form == "layers" and min(self.counts, default=1) < 1:
            raise ScheduleError(f"reuse map {self.text} has a count below 1; every layer runs at least once")
        if self.form != "layers" and n_layers != len(self.counts):
            raise ScheduleError(f"map {self.text} is for {len(self.counts)} layers but the model has {n_layers}")
        if max_reuse is not None:
            check_max_reuse(self.counts, max_reuse, f"{'block' if self.form == 'block' else 'reuse'} map {self.text}")
        return self

    def configure(self, cfg: ModelConfig) -> ModelConfig:
        """`cfg` running this map's parts (ModelConfig.parts): the schedule gives the order, the config the branches."""
        return cfg if cfg.parts == self.parts else dataclasses.replace(cfg, parts=self.parts)


def cast_layers(n_layers: int | None, text: str) -> int:
    if n_layers is None:
        raise ScheduleError(f"the counts of map {text!r} need the number of layers")
    return n_layers


def parse_keyed_map(text: str, n_layers: int, where: str) -> Map:
    """A map with its knob settings as a person writes it (`block:16-27:2|damping=0.5`, `2,1,1,1`), with the knobs
    that act on it (Map.acting); one error line naming `where` for a fault of either."""
    try:
        return Map.parse(text, n_layers).checked(n_layers).acting()
    except ValueError as e:  # ScheduleError is a UserInputError, a ValueError
        raise ScheduleError(f"{where}: {e}") from None


def map_text(map_key: str) -> str:
    """The map of a study's key without its knobs, as written: "2,1,1,1" or "block:1-2:2"."""
    return map_key.partition(KNOB_SEPARATOR)[0]


def key_text(text: str, knobs: str | None = None) -> str:
    """The key of a map's text (`2,1,1,1`, `block:1-2:2`) and its knob text (None or '': every knob off)."""
    return f"{text}{KNOB_SEPARATOR}{knobs}" if knobs else text


def parsed_key(map_key: str) -> Map | None:
    """A key parsed without the model's layers: a per-layer map's or the deeper model's; None for any other (a
    block or the stack, which need the layers) and for text that is no map."""
    if Map.form_of(map_key) in ("block", "stack"):
        return None
    try:
        return Map.parse(map_key)
    except ScheduleError:
        return None


def is_baseline_key(map_key: str) -> bool:
    """The paper's baseline: the all-ones map with every knob off (Map.kind `plain`)."""
    parsed = parsed_key(map_key)
    return parsed is not None and parsed.kind == "plain"


def is_all_ones_key(map_key: str) -> bool:
    """The all-ones map of the study's model, whatever its knobs."""
    parsed = parsed_key(map_key)
    return parsed is not None and parsed.is_baseline


def shown_key(map_key: str) -> str:
    """A map key as output shows it: `plain` for the plain model (not its L ones), any other key as it is."""
    return PLAIN_TEXT if is_baseline_key(map_key) else map_key


def as_block(map_key: str) -> str:
    """A key as a study of blocks writes it: a per-layer map that repeats one layer only (`1,1,2,1`, the canonical
    key of the block of that layer) as that block (`block:2-2:2`), its knobs kept; any other key as it is."""
    parsed = parsed_key(map_key)
    block = parsed.one_block() if parsed is not None and not parsed.is_baseline else None
    return map_key if block is None else block.key


def map_of_schedule(schedule: Sequence[int], n_layers: int) -> Map | None:
    """The map whose schedule this is (canonical, as Map.parse gives it): a per-layer map's (each layer's runs in a
    row, in order) or one block's ([0..I-1] + [I..J] * R + [J+1..L-1]); None for a schedule that is neither."""
    counts = [0] * n_layers
    for layer in schedule:
        if not 0 <= layer < n_layers:
            return None
        counts[layer] += 1
    if min(counts, default=0) < 1:
        return None
    as_counts = Map.of_counts(counts)
    if as_counts.schedule() == list(schedule):
        return as_counts
    repeated = [i for i, r in enumerate(counts) if r > 1]
    if not repeated:  # every layer once, out of order
        return None
    block = Map.of_block(repeated[0], repeated[-1], counts[repeated[0]], n_layers)
    return block.canonical() if block.schedule() == list(schedule) else None


def check_max_reuse(reuse_map: Sequence[int], max_reuse: int, where: str) -> None:
    """No layer of the map runs more than the space's [search] max_reuse times: the one rule of `run --enqueue`,
    `flops` and `train` (`where` names the map in the message)."""
    if max(reuse_map) > max_reuse:
        raise ScheduleError(
            f"{where}: a layer runs {max(reuse_map)} times, above the space's max_reuse {max_reuse} "
            "([search] max_reuse)"
        )


def format_reuse_map(reuse_map: Sequence[int]) -> str:
    return Map.of_counts(reuse_map).text


def reuse_map_schedule(reuse_map: Sequence[int]) -> list[int]:
    """Layer l runs reuse_map[l] times in a row: [2, 1, 1] -> [0, 0, 1, 2]."""
    return Map.of_counts(reuse_map).schedule()


def block_schedule(n_layers: int, k: int) -> list[int]:
    """The whole stack run k times: (4, 2) -> [0, 1, 2, 3, 0, 1, 2, 3]."""
    if k < 1:
        raise ScheduleError(f"--block must be a positive integer, got {k}")
    return Map.of_stack(k, n_layers).schedule()


def resolve_schedule(
    n_layers: int, reuse_map: str | Sequence[int] | None = None, block: int | None = None, max_reuse: int | None = None
) -> tuple[list[int], list[int], int | None]:
    """(reuse_map, schedule, block) from either a map (its text, any form Map.parse reads, or its per-layer counts)
    or a block count; neither means the all-ones map. With `max_reuse` (the space's), a map with a layer run more
    often than that is refused.

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
        chosen = Map.baseline(n_layers)
    elif isinstance(reuse_map, str):
        chosen = Map.parse(reuse_map, n_layers)
        if chosen.knobs:
            raise ScheduleError(f"map {reuse_map!r}: give its knobs with --knobs, not after '|'")
        if chosen.is_stack:
            return resolve_schedule(n_layers, None, chosen.repeats, max_reuse)
    else:
        chosen = Map.of_counts(reuse_map).checked(n_layers)
    chosen.checked(n_layers, max_reuse)
    return list(chosen.counts), chosen.schedule(), None
