"""Trial checkpoints: the proxy's state (model, optimizer, step, curve, RNG), saved atomically, tensors only."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ilr_search.records import EvalPoint


def save_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, curve: list[EvalPoint]
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "curve": [[p.step, p.tokens, p.val_loss, p.val_ppl, p.val_bpb] for p in curve],
        "rng": torch.get_rng_state(),
    }
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(state, tmp)
    os.replace(tmp, path)  # a reader sees the old checkpoint or the new one, never half of one


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[int, list[EvalPoint]]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    curve = [EvalPoint(int(s), int(t), float(loss), float(p), float(b)) for s, t, loss, p, b in state["curve"]]
    return int(state["step"]), curve


def continue_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, lr: float, last_stable_step: int
) -> tuple[int, list[EvalPoint]]:
    """Load a wsd run's stable-phase checkpoint for a longer run to continue (train_proxy's `start_from`);
    ValueError where it was not taken at the peak learning rate `lr` (in a warmup or a cooldown) or lies past
    the continuing run's own constant phase, which ends at `last_stable_step`."""
    step, curve = load_checkpoint(path, model, optimizer)
    saved_lr = optimizer.param_groups[0]["lr"]
    if saved_lr != lr:
        raise ValueError(f"{path}: taken at learning rate {saved_lr:g}, not in the constant phase at {lr:g}")
    if step > last_stable_step:
        raise ValueError(f"{path}: taken at step {step}, after this run's cooldown starts (step {last_stable_step})")
    return step, curve
