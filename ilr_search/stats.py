"""Rank agreement between two rankings of the same maps (scipy's Spearman and Kendall)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def rank_agreement(a: Sequence[float], b: Sequence[float]) -> tuple[float | None, float | None]:
    """(Spearman rho, Kendall tau-b) of paired values; None where undefined (fewer than 3 pairs, or a
    constant side)."""
    if len(a) != len(b):
        raise ValueError(f"rank agreement needs paired values, got {len(a)} and {len(b)}")
    if len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return None, None
    from scipy.stats import kendalltau, spearmanr

    rho = float(spearmanr(a, b)[0])
    tau = float(kendalltau(a, b)[0])
    return (rho if math.isfinite(rho) else None), (tau if math.isfinite(tau) else None)
