"""Recurrence knobs as search dimensions: their names, their choices, and how a choice sets the model config.

The model implements them (model.py's docstring says exactly what each does); a study lists the ones it
searches (`[search] knobs`, `--knobs`), and each becomes a categorical dimension next to the reuse counts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from .model import INJECTIONS, ModelConfig

KnobValue = str | bool

# name -> choices; the first choice is "off", the model as the paper ran it
KNOB_CHOICES: dict[str, tuple[KnobValue, ...]] = {
    "injection": INJECTIONS,
    "iteration_encoding": (False, True),
    "iteration_norms": (False, True),
    "depth_init": (False, True),
}
KNOBS = tuple(KNOB_CHOICES)


def check_knobs(names: Sequence[str]) -> None:
    unknown = [n for n in names if n not in KNOB_CHOICES]
    if unknown:
        raise ValueError(f"unknown knob(s) {', '.join(map(repr, unknown))}; use {', '.join(KNOBS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"knobs are listed twice: {list(names)}")


def knobs_of(cfg: ModelConfig) -> dict[str, KnobValue]:
    """The knob settings a model config has (depth_init: whether its init depth differs from n_layers)."""
    return {"injection": cfg.injection, "iteration_encoding": cfg.iteration_encoding,
            "iteration_norms": cfg.iteration_norms, "depth_init": cfg.init_depth > 0}


def with_knobs(cfg: ModelConfig, knobs: Mapping[str, KnobValue], init_depth: int) -> ModelConfig:
    """`cfg` with the given knobs set; depth_init initialises the residual projections for `init_depth` layer
    runs (a study passes the deepest schedule its budget pays for, the same for every map)."""
    check_knobs(list(knobs))
    fields: dict[str, object] = {k: v for k, v in knobs.items() if k != "depth_init"}
    if "depth_init" in knobs:
        fields["init_depth"] = init_depth if knobs["depth_init"] else 0
    return dataclasses.replace(cfg, **fields)


def format_knobs(knobs: Mapping[str, KnobValue]) -> str:
    """`injection=add,iteration_norms=on`: the knobs that are not off, in a fixed order; '' when all are off."""
    parts = []
    for name in KNOBS:
        value = knobs.get(name, KNOB_CHOICES[name][0])
        if value != KNOB_CHOICES[name][0]:
            parts.append(name if value is True else f"{name}={value}")
    return ",".join(parts)
