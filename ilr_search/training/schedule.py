"""Reuse maps and block recurrence as execution schedules (lists of layer indices)."""

from __future__ import annotations

from collections.abc import Sequence

from ilr_search.errors import UserInputError


class ScheduleError(UserInputError):
    """A reuse map or block count that cannot be run."""


def parse_reuse_map(text: str, n_layers: int) -> list[int]:
    """`"4,2,1,1"` -> [4, 2, 1, 1], checked against the number of layers."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        reuse_map = [int(p) for p in parts]
    except ValueError:
        raise ScheduleError(f"reuse map {text!r} must be comma-separated integers, one per layer, e.g. 2,1,1,1") from None
    check_reuse_map(reuse_map, n_layers)
    return reuse_map


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
    return ",".join(str(r) for r in reuse_map)


def reuse_map_schedule(reuse_map: Sequence[int]) -> list[int]:
    """Layer l runs reuse_map[l] times in a row: [2, 1, 1] -> [0, 0, 1, 2]."""
    return [layer for layer, count in enumerate(reuse_map) for _ in range(count)]


def block_schedule(n_layers: int, k: int) -> list[int]:
    """The whole stack run k times: (4, 2) -> [0, 1, 2, 3, 0, 1, 2, 3]."""
    if k < 1:
        raise ScheduleError(f"--block must be a positive integer, got {k}")
    return list(range(n_layers)) * k


def baseline_map(n_layers: int) -> list[int]:
    return [1] * n_layers


def resolve_schedule(n_layers: int, reuse_map: str | Sequence[int] | None = None,
                     block: int | None = None, max_reuse: int | None = None) -> tuple[list[int], list[int], int | None]:
    """(reuse_map, schedule, block) from either a reuse map or a block count; neither means the all-ones map.
    With `max_reuse` (the space's), a reuse map with a layer run more often than that is refused.

    For block recurrence the reuse map lists how often each layer runs (K each); the schedule gives the order.
    """
    if reuse_map is not None and block is not None:
        raise ScheduleError("give either --reuse-map or --block, not both")
    if block is not None:
        return [block] * n_layers, block_schedule(n_layers, block), block
    if reuse_map is None:
        counts = baseline_map(n_layers)
    elif isinstance(reuse_map, str):
        counts = parse_reuse_map(reuse_map, n_layers)
    else:
        counts = list(reuse_map)
        check_reuse_map(counts, n_layers)
    if max_reuse is not None:
        check_max_reuse(counts, max_reuse, f"reuse map {format_reuse_map(counts)}")
    return counts, reuse_map_schedule(counts), None
