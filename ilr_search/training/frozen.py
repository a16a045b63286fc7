"""Frozen evaluation: a reuse map applied to a model's weights as they are (a pretrained checkpoint's), trained
for no step and only evaluated. The noise of a frozen result is which text was evaluated, not a seed: a run at
seed s evaluates chunk s of the held-out windows (TokenData.window_chunk), so that the race's seeds become disjoint
window chunks and its paired differences are paired by chunk (docs/race.md, "Frozen search")."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ilr_search.config import TrainConfig
from ilr_search.data.tokens import TokenData, counted_targets
from ilr_search.records import EvalPoint
from ilr_search.training.device import autocast_for, resolve_dtype
from ilr_search.training.loss import linear_cross_entropy
from ilr_search.training.model import ILRTransformer


@dataclass(frozen=True)
class WindowLosses:
    """A model's losses on one chunk of held-out windows: `losses[i]` is the mean loss (nats) over the
    `tokens_per_window[i]` targets the window starting at `starts[i]` counts (seq_len; with answers, its answer's
    tokens); `nats` their sum over every counted target, `bytes` the UTF-8 bytes those targets cover."""

    chunk: int
    starts: tuple[int, ...]
    losses: tuple[float, ...]
    tokens_per_window: tuple[int, ...]
    nats: float
    bytes: int

    @property
    def val_loss(self) -> float:
        """The chunk's loss: the mean per counted target (with windows of equal length, the mean over windows)."""
        return self.nats / max(1, sum(self.tokens_per_window))

    @property
    def val_ppl(self) -> float:
        return math.exp(min(self.val_loss, 700.0))

    @property
    def val_bpb(self) -> float:
        return self.nats / math.log(2) / self.bytes


@torch.no_grad()
def window_losses(
    model: ILRTransformer,
    schedule: Sequence[int],
    data: TokenData,
    chunk: int,
    n_windows: int,
    batch_size: int = 8,
    compute_dtype: torch.dtype = torch.float32,
) -> WindowLosses:
    """The loss of `model` running `schedule` on each window of chunk `chunk` (n_windows windows of the model's
    seq_len), one value a window, on the model's device."""
    seq_len = model.cfg.seq_len
    device = next(model.parameters()).device
    windows = data.window_chunk(chunk, n_windows, seq_len)
    was_training = model.training
    model.eval()
    sums: list[torch.Tensor] = []
    counted: list[int] = []
    for x_np, y_np in data.window_batches(windows, seq_len, batch_size):
        counted += [counted_targets(row) for row in y_np]
        x, y = torch.from_numpy(x_np).to(device), torch.from_numpy(y_np).to(device)
        with autocast_for(device, compute_dtype):
            hidden = model.hidden(x, schedule)  # the layers run on the whole batch
            for row in range(x.shape[0]):  # the head one window at a time: its own summed loss
                sums.append(
                    linear_cross_entropy(
                        hidden[row : row + 1],
                        model.head_weight,
                        y[row : row + 1],
                        compute_dtype,
                        "sum",
                        ignore_index=data.ignore_index,
                    )
                )
    model.train(was_training)
    nats = torch.stack(sums).double().cpu().tolist()  # the chunk's one host sync
    return WindowLosses(
        chunk,
        tuple(int(s) for s in windows.starts),
        tuple(n / max(1, c) for n, c in zip(nats, counted, strict=True)),
        tuple(counted),
        math.fsum(nats),
        data.val.bytes_between(windows.begins, windows.ends),
    )


def evaluate_frozen(
    model: ILRTransformer,
    schedule: Sequence[int],
    data: TokenData,
    cfg: TrainConfig,
    on_eval: Callable[[EvalPoint], bool] | None = None,
) -> tuple[WindowLosses, EvalPoint, float]:
    """A run of no step: `model` (its weights as built) evaluated on chunk cfg.seed of cfg.eval_windows held-out
    windows. Returns the window losses, the run's one evaluation point (step 0; `on_eval` sees it) and the
    seconds it took."""
    dtype = resolve_dtype(cfg.dtype, next(model.parameters()).device)
    compute_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    t0 = time.perf_counter()
    windows = window_losses(model, schedule, data, cfg.seed, cfg.eval_windows, cfg.batch_size, compute_dtype)
    point = EvalPoint(0, 0, windows.val_loss, windows.val_ppl, windows.val_bpb)
    if on_eval is not None:
        on_eval(point)  # nothing to stop: the run is this one evaluation
    return windows, point, time.perf_counter() - t0


def chunk_window_losses(
    model: ILRTransformer, schedule: Sequence[int], data: TokenData, cfg: TrainConfig, chunks: Sequence[int]
) -> list[WindowLosses]:
    """Each chunk's window losses of `model` (train.build_model builds it as a run does: its init's weights where
    it has one) running `schedule`, in cfg's windows a chunk and dtype: for reports and for checking the
    window-paired test."""
    dtype = resolve_dtype(cfg.dtype, next(model.parameters()).device)
    compute_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    return [window_losses(model, schedule, data, c, cfg.eval_windows, cfg.batch_size, compute_dtype) for c in chunks]
