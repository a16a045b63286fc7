"""Pareto fronts of (perplexity, FLOP ratio), both minimised."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

R = TypeVar("R")


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """a is no worse than b in every objective and better in at least one (minimisation)."""
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(x < y for x, y in zip(a, b, strict=True))


def non_dominated(points: Sequence[Sequence[float]]) -> list[int]:
    """Indices of the points no other point dominates; of identical points only the first is kept."""
    front: list[int] = []
    for i, p in enumerate(points):
        if any(dominates(q, p) for q in points):
            continue
        if any(tuple(points[j]) == tuple(p) for j in front):
            continue
        front.append(i)
    return front


def pareto_front(rows: Sequence[R], objectives: Callable[[R], tuple[float, float]]) -> list[R]:
    """The rows whose `objectives` (y, x) are non-dominated, sorted by x (compute), then y, ascending."""
    points = [objectives(r) for r in rows]
    front = sorted(non_dominated(points), key=lambda i: (points[i][1], points[i][0]))
    return [rows[i] for i in front]


def non_dominated_ranks(points: Sequence[Sequence[float]]) -> list[int]:
    """Rank of each point by non-dominated sorting: 0 for the front, 1 for the front without it, ..."""
    ranks = [-1] * len(points)
    remaining = set(range(len(points)))
    rank = 0
    while remaining:
        layer = {i for i in remaining if not any(dominates(points[j], points[i]) for j in remaining)}
        for i in layer:
            ranks[i] = rank
        remaining -= layer
        rank += 1
    return ranks
