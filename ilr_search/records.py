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


@dataclass(frozen=True)
class TrainLossPoint:
    """The mean training loss of the steps since the previous read (a window of SYNC_EVERY steps, shorter at
    evaluations and checkpoints), at the window's last step."""

    step: int
    tokens: int
    loss: float
