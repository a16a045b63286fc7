"""Records of training results shared by the trainer, its checkpoints and their readers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EvalPoint:
    step: int
    tokens: int
    val_loss: float
    val_ppl: float
    val_bpb: float
