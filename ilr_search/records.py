"""Records of training results shared by the trainer, its checkpoints and their readers, and record_json, the
JSON form of a report's records."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EvalPoint:
    step: int
    tokens: int
    val_loss: float
    val_ppl: float
    val_bpb: float


@dataclass(frozen=True)
class TrainLossPoint:
    """The mean training loss of the steps since the previous read (a window of SYNC_EVERY steps, shorter at
    evaluations and checkpoints), at the window's last step."""

    step: int
    tokens: int
    loss: float


def record_json(
    record: Any, names: Mapping[str, str] | None = None, omit: Collection[str] = (), **values: Any
) -> dict[str, Any]:
    """A dataclass record's JSON form: its fields in order, each under its name (or `names`' for it), but those in
    `omit`, with `values` in place of the fields they name; a nested record by its own to_dict (else its fields),
    tuples as lists, mappings as dicts."""
    names = names or {}
    return {
        names.get(f.name, f.name): _plain(values[f.name] if f.name in values else getattr(record, f.name))
        for f in dataclasses.fields(record)
        if f.name not in omit
    }


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return value.to_dict() if hasattr(value, "to_dict") else record_json(value)
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value
