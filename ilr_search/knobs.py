"""Recurrence knobs as search dimensions: their names, their choices, and how a choice sets the model config.

The model implements them (model.py's docstring says exactly what each does); a study lists the ones it
searches (`[search] knobs`, `--knobs`), and each becomes a categorical dimension next to the reuse counts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ilr_search.config import INJECTIONS, REPEAT_SCALES, ModelConfig

KnobValue = str | bool | float

# name -> choices; the first choice is "off", the model as the paper ran it. damping's are the grid a search
# samples; any a in (0, 1] can be set by hand (`|damping=0.3`, `train --knobs damping=0.3`).
KNOB_CHOICES: dict[str, tuple[KnobValue, ...]] = {
    "injection": INJECTIONS,
    "iteration_encoding": (False, True),
    "iteration_norms": (False, True),
    "depth_init": (False, True),
    "repeat_scale": REPEAT_SCALES,
    "damping": (1.0, 0.5, 0.25, 0.1),
    "adapters": (0, 4, 8, 16),  # the rank of each repeated pass's low-rank adapters (ModelConfig.adapter_rank)
    "capacity": (1.0, 0.75, 0.5, 0.25),  # the fraction of tokens each repeated pass runs (ModelConfig.capacity)
}
KNOBS = tuple(KNOB_CHOICES)
CONTINUOUS_KNOBS = ("damping", "capacity")  # knobs that take any value in (0, 1], not only their choices
RANK_KNOBS = ("adapters",)  # knobs that take any whole number >= 0 (a rank), not only their choices
# knobs that act on the passes of a repeated layer only (model.branch_scales, the adapters, the routers): a schedule
# that repeats no layer is the same model with them or without
REPEAT_FACTORS = ("damping", "repeat_scale", "adapters", "capacity")
# knobs whose model field has another name
KNOB_FIELDS = {"adapters": "adapter_rank"}


def knob_choices(name: str, damping_choices: Sequence[float] = ()) -> tuple[KnobValue, ...]:
    """The choices a search samples for knob `name`: KNOB_CHOICES', or for damping the study's
    `damping_choices` where given ([search] damping_choices)."""
    if name == "damping" and damping_choices:
        return tuple(float(a) for a in damping_choices)
    return KNOB_CHOICES[name]


def check_knobs(names: Sequence[str]) -> None:
    unknown = [n for n in names if n not in KNOB_CHOICES]
    if unknown:
        raise ValueError(f"unknown knob(s) {', '.join(map(repr, unknown))}; use {', '.join(KNOBS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"knobs are listed twice: {list(names)}")


def knobs_of(cfg: ModelConfig) -> dict[str, KnobValue]:
    """The knob settings a model config has (depth_init: whether its init depth differs from n_layers)."""
    return {
        "injection": cfg.injection,
        "iteration_encoding": cfg.iteration_encoding,
        "iteration_norms": cfg.iteration_norms,
        "depth_init": cfg.init_depth > 0,
        "repeat_scale": cfg.repeat_scale,
        "damping": cfg.damping,
        "adapters": cfg.adapter_rank,
        "capacity": cfg.capacity,
    }


def with_knobs(cfg: ModelConfig, knobs: Mapping[str, KnobValue], init_depth: int) -> ModelConfig:
    """`cfg` with the given knobs set; depth_init initialises the residual projections for `init_depth` layer
    runs (a study passes the deepest schedule its budget pays for, the same for every map)."""
    check_knobs(list(knobs))
    for name, value in knobs.items():
        check_knob_value(name, value)
    fields: dict[str, Any] = {KNOB_FIELDS.get(k, k): v for k, v in knobs.items() if k != "depth_init"}
    if "depth_init" in knobs:
        fields["init_depth"] = init_depth if knobs["depth_init"] else 0
    return dataclasses.replace(cfg, **fields)


def check_knob_value(name: str, value: KnobValue) -> None:
    """A ValueError unless `value` is a setting of knob `name`: one of its choices, or for a continuous knob any
    number in (0, 1]."""
    if name in CONTINUOUS_KNOBS:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise ValueError(f"knob {name} takes a number in (0, 1], got {value!r}")
    elif name in RANK_KNOBS:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"knob {name} takes a whole number >= 0 (a rank; 0: off), got {value!r}")
    elif value not in KNOB_CHOICES[name]:
        raise ValueError(f"knob {name} has no setting {value!r}; use one of {list(KNOB_CHOICES[name])}")


def parse_knob_settings(text: str) -> dict[str, KnobValue]:
    """`injection=gated,iteration_norms` -> {"injection": "gated", "iteration_norms": True}: a bare name turns a
    knob on (injection: "add"); `name=off` turns it off."""
    settings: dict[str, KnobValue] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, value = part.partition("=")
        check_knobs([name])
        choices = KNOB_CHOICES[name]
        if name in CONTINUOUS_KNOBS:
            settings[name] = _number(name, value or "")
            continue
        if name in RANK_KNOBS and value not in ("", "off", "none", "false"):
            if not value.isdigit():
                raise ValueError(f"knob {name} takes a rank, a whole number >= 0 (e.g. {name}=8), got {value!r}")
            settings[name] = int(value)
            continue
        if not value:
            settings[name] = choices[1]
        elif value in ("off", "none", "false"):
            settings[name] = choices[0]
        elif value in ("on", "true") and choices[1] is True:
            settings[name] = True
        elif value in choices:
            settings[name] = value
        else:
            raise ValueError(
                f"knob {name} has no setting {value!r}; use one of "
                f"{', '.join('on' if c is True else 'off' if c is False else str(c) for c in choices)}"
            )
    return settings


def _number(name: str, text: str) -> float:
    """A continuous knob's setting from its text (`damping=0.5`, `capacity=0.5`; `off` is 1: the plain repeat, every
    token)."""
    if text in ("off", "none", "false"):
        return 1.0
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"knob {name} takes a number in (0, 1] (e.g. {name}=0.5), got {text!r}") from None
    check_knob_value(name, value)
    return value


def acting_knobs(knobs: Mapping[str, KnobValue], schedule: Sequence[int]) -> dict[str, KnobValue]:
    """The knobs that act on `schedule`: all of them, less the REPEAT_FACTORS where it repeats no layer (so that
    the plain map with damping is the plain map: one key, one evaluation)."""
    if len(set(schedule)) < len(schedule):
        return dict(knobs)
    return {name: value for name, value in knobs.items() if name not in REPEAT_FACTORS}


def config_key(map_key: str, knobs: Mapping[str, KnobValue]) -> str:
    """What a study dedupes, claims and compares on: the map, plus the knobs that are not off."""
    described = format_knobs(knobs)
    return f"{map_key}|{described}" if described else map_key


def knob_params(cfg: ModelConfig) -> dict[str, int]:
    """Parameters each knob of `cfg` adds (the `flops --json` key `knob_params`)."""
    return {
        "injection": cfg.n_layers if cfg.injection == "gated" else 0,
        "iteration_encoding": cfg.max_reuse * cfg.d_model if cfg.iteration_encoding else 0,
        "iteration_norms": cfg.n_layers * (cfg.max_reuse - 1) * 2 * cfg.d_model if cfg.iteration_norms else 0,
        "depth_init": 0,
        "repeat_scale": 0,
        "damping": 0,
        "adapters": cfg.n_layers * (cfg.max_reuse - 1) * cfg.adapter_params_per_pass,
        "capacity": cfg.router_params,
    }


def format_knobs(knobs: Mapping[str, KnobValue]) -> str:
    """`injection=add,iteration_norms=on`: the knobs that are not off, in a fixed order; '' when all are off."""
    parts = []
    for name in KNOBS:
        value = knobs.get(name, KNOB_CHOICES[name][0])
        if value != KNOB_CHOICES[name][0]:
            text = f"{value:g}" if isinstance(value, float) else str(value)
            parts.append(name if value is True else f"{name}={text}")
    return ",".join(parts)
