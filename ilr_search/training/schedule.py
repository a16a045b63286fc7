"""Reuse maps and block recurrence as execution schedules (lists of layer indices). `ReuseMap` is the value type;
the functions below take and give plain lists of counts, as most of the package still passes them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ilr_search.errors import UserInputError


class ScheduleError(UserInputError):
    """A reuse map or block count that cannot be run."""


@dataclass(frozen=True)
class ReuseMap:
    """How many times in a row each layer runs: `4,2,1,1`. Its text form is also its key in a study (the map key of
    a trial with every knob off); the baseline runs every layer once."""
    counts: tuple[int, ...]

    @classmethod
    def parse(cls, text: str, n_layers: int) -> ReuseMap:
        """`"4,2,1,1"`, checked against the number of layers (and every count at least 1)."""
        parts = [p.strip() for p in str(text).split(",")]
        try:
            counts = tuple(int(p) for p in parts)
        except ValueError:
            raise ScheduleError(f"reuse map {text!r} must be comma-separated integers, one per layer, e.g. 2,1,1,1"
                                ) from None
        return cls(counts).checked(n_layers)

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
        return ",".join(str(r) for r in self.counts)

    def __str__(self) -> str:
        return self.key

    @property
    def is_baseline(self) -> bool:
        return bool(self.counts) and all(r == 1 for r in self.counts)

    @property
    def layer_runs(self) -> int:
        """The layers the map runs in one forward pass (its depth of compute)."""
        return sum(self.counts)

    def schedule(self) -> list[int]:
        """Layer l runs counts[l] times in a row: 2,1,1 -> [0, 0, 1, 2]."""
        return [layer for layer, count in enumerate(self.counts) for _ in range(count)]


def parse_reuse_map(text: str, n_layers: int) -> list[int]:
    """`"4,2,1,1"` -> [4, 2, 1, 1], checked against the number of layers."""
    return list(ReuseMap.parse(text, n_layers).counts)


def check_reuse_map(reuse_map: Sequence[int], n_layers: int) -> None:
    if len(reuse_map) != n_layers:
        raise ScheduleError(
            f"reuse map {format_reuse_map(reuse_map)} has {len(reuse_map)} entries but the model has "
            f"{n_layers} layers; give one count per layer or change --layers")
    if any(r < 1 for r in reuse_map):
        raise ScheduleError(f"reuse map {format_reuse_map(reuse_map)} has a count below 1; every layer runs at least once")


def check_max_reuse(reuse_map: Sequence[int], max_reuse: int, where: str) -> None:
    """No layer of the map runs more than the space's [search] max_reuse times: the one rule of `run --enqueue`,
    `flops` and `train` (`where` names the map in the message)."""
    if max(reuse_map) > max_reuse:
        raise ScheduleError(f"{where}: a layer runs {max(reuse_map)} times, above the space's max_reuse {max_reuse} "
                            "([search] max_reuse)")


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


def baseline_map(n_layers: int) -> list[int]:
    return list(ReuseMap.baseline(n_layers).counts)


def resolve_schedule(n_layers: int, reuse_map: str | Sequence[int] | None = None,
                     block: int | None = None, max_reuse: int | None = None) -> tuple[list[int], list[int], int | None]:
    """(reuse_map, schedule, block) from either a reuse map or a block count; neither means the all-ones map.
    With `max_reuse` (the space's), a reuse map with a layer run more often than that is refused.

    For block recurrence the reuse map lists how often each layer runs (K each); the schedule gives the order.
    """
    if reuse_map is not None and block is not None:
        raise ScheduleError("give either --reuse-map or --block, not both")
    if block is not None:
        if block >= 1 and max_reuse is not None:  # before the schedule is built: a huge K is refused, not allocated
            check_max_reuse([block], max_reuse, f"--block {block}")
        return [block] * n_layers, block_schedule(n_layers, block), block
    if reuse_map is None:
        chosen = ReuseMap.baseline(n_layers)
    elif isinstance(reuse_map, str):
        chosen = ReuseMap.parse(reuse_map, n_layers)
    else:
        chosen = ReuseMap(tuple(reuse_map)).checked(n_layers)
    chosen.checked(n_layers, max_reuse)
    return list(chosen.counts), chosen.schedule(), None
