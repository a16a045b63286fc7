"""The LM head and its cross-entropy, fused and chunked: the full (tokens x vocab) logits never exist.

`F.cross_entropy(F.linear(h, W).float(), y)` materialises the logits, an fp32 copy of them, their log-softmax
and its gradient: at vocab 32000 and 8k tokens, four 1 GB tensors per step. Here the tokens are taken a chunk
at a time; for each chunk the logits are made in the compute dtype, the loss is read from their fp32
log-softmax, and, when a gradient is needed, d loss / d logits = (softmax - onehot) / N is formed at once and
multiplied into the gradients of the hidden states and of W. Backward then only scales the stored gradients.
The FLOPs are those of the plain head (one forward matmul, two backward ones); memory is one chunk of logits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ilr_search.training.device import compiled_once

Tensor = torch.Tensor
# (h, w, y, need_grad) -> (summed loss, grad h, grad w); the weighted one takes each target's weight before need_grad
ChunkFn = Callable[..., tuple[Tensor, Tensor | None, Tensor | None]]

LOGITS_PER_CHUNK = 1 << 25  # elements of one chunk's fp32 logits (128 MiB): chunk tokens = this // vocab


def _chunk_loss(h: Tensor, w: Tensor, y: Tensor, need_grad: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Summed loss of one chunk, and (if asked) the gradients of that sum w.r.t. h and w, in h's dtype."""
    log_probs = torch.log_softmax((h @ w.t()).float(), dim=-1)  # one pass on CPU, where logsumexp takes five
    loss = -log_probs.gather(1, y[:, None]).sum()
    if not need_grad:
        return loss, None, None
    d_logits = log_probs.exp_()  # softmax, in place
    d_logits.scatter_add_(1, y[:, None], torch.full((y.shape[0], 1), -1.0, dtype=d_logits.dtype, device=y.device))
    d_logits = d_logits.to(h.dtype)
    return loss, d_logits @ w, d_logits.t() @ h


def _weighted_chunk_loss(
    h: Tensor, w: Tensor, y: Tensor, weight: Tensor, need_grad: bool
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """`_chunk_loss` with each target's loss (and its gradient) multiplied by `weight` (1: counted, 0: ignored)."""
    log_probs = torch.log_softmax((h @ w.t()).float(), dim=-1)
    loss = -(log_probs.gather(1, y[:, None])[:, 0] * weight).sum()
    if not need_grad:
        return loss, None, None
    d_logits = log_probs.exp_()
    d_logits.scatter_add_(1, y[:, None], torch.full((y.shape[0], 1), -1.0, dtype=d_logits.dtype, device=y.device))
    d_logits = (d_logits * weight[:, None]).to(h.dtype)
    return loss, d_logits @ w, d_logits.t() @ h


class HeadBuffers:
    """Memory that a caller's no-grad heads reuse (the frozen evaluator's, one row of windows at a time): a chunk's
    logits, their fp32 copy and their log-softmax written into the same tensors call after call, by the same kernels
    as `_chunk_loss`'s (the same numbers). On the CPU a fresh tensor of a chunk's size is fresh pages, which the kernel
    zeroes at first touch: for SmolLM2's vocab, three 25-50 MB tensors a row of 256 tokens."""

    def __init__(self) -> None:
        self._tensors: dict[str, Tensor] = {}

    def get(self, name: str, shape: tuple[int, int], like: Tensor, dtype: torch.dtype) -> Tensor:
        n = shape[0] * shape[1]
        t = self._tensors.get(name)
        if t is None or t.numel() < n or t.dtype != dtype or t.device != like.device:
            t = self._tensors[name] = torch.empty(n, dtype=dtype, device=like.device)
        return t[:n].view(shape)


def _chunk_loss_into(h: Tensor, w: Tensor, y: Tensor, buffers: HeadBuffers) -> Tensor:
    """`_chunk_loss`'s summed loss without a gradient, its tensors in `buffers`."""
    shape = (h.shape[0], w.shape[0])
    logits = torch.mm(h, w.t(), out=buffers.get("logits", shape, h, h.dtype))
    if logits.dtype != torch.float32:
        logits = buffers.get("fp32", shape, h, torch.float32).copy_(logits)
    log_probs = torch.log_softmax(logits, dim=-1, out=buffers.get("log_probs", shape, h, torch.float32))
    return -log_probs.gather(1, y[:, None]).sum()


def compiled_chunk_loss() -> ChunkFn:
    """`_chunk_loss` compiled once per process (device.compiled_once): on CUDA the softmax, its fp32 upcast and
    the one-hot subtraction fuse into the kernels around the two matmuls."""
    return compiled_once(_chunk_loss)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        h: Tensor,
        w: Tensor,
        y: Tensor,
        compute_dtype: torch.dtype,
        reduction: str,
        chunk_fn: ChunkFn,
        ignore_index: int | None,
        buffers: HeadBuffers | None,
    ) -> Tensor:
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        weight: Tensor | None = None
        if ignore_index is not None:
            counted = y != ignore_index
            y, weight = torch.where(counted, y, 0), counted.float()
        n, vocab = h.shape[0], w.shape[0]
        hc, wc = h.to(compute_dtype), w.to(compute_dtype)
        n_chunks = -(-n // max(1, LOGITS_PER_CHUNK // vocab))
        chunk = -(-n // n_chunks)  # equal chunks: one compiled shape (plus at most one shorter last chunk)
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        grad_h = torch.empty_like(hc) if need_grad else None
        grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if need_grad else None
        with torch.autocast(h.device.type, enabled=False):
            for start in range(0, n, chunk):
                part = slice(start, min(n, start + chunk))
                if weight is None and buffers is not None and not need_grad:
                    loss, g_h, g_w = _chunk_loss_into(hc[part], wc, y[part], buffers), None, None
                elif weight is None:
                    loss, g_h, g_w = chunk_fn(hc[part], wc, y[part], need_grad)
                else:
                    loss, g_h, g_w = chunk_fn(hc[part], wc, y[part], weight[part], need_grad)
                total += loss
                if grad_h is not None and grad_w is not None:  # need_grad: the chunk gave its gradients
                    assert g_h is not None and g_w is not None
                    grad_h[part] = g_h
                    grad_w += g_w
        # The mean is over the counted targets; with none counted the loss and its gradients are 0.
        scale: float | Tensor = 1.0
        if reduction == "mean":
            scale = 1.0 / n if weight is None else 1.0 / weight.sum().clamp(min=1.0)
        if need_grad:
            ctx.save_for_backward(grad_h, grad_w)
            ctx.scale, ctx.dtypes = scale, (h.dtype, w.dtype)
        return total * scale

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        grad_h, grad_w = ctx.saved_tensors
        g = grad_out * ctx.scale
        h_dtype, w_dtype = ctx.dtypes
        return (grad_h * g.to(grad_h.dtype)).to(h_dtype), (grad_w * g).to(w_dtype), None, None, None, None, None, None


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    compute_dtype: torch.dtype | None = None,
    reduction: str = "mean",
    compiled: bool = False,
    ignore_index: int | None = None,
    buffers: HeadBuffers | None = None,
) -> Tensor:
    """cross_entropy(hidden @ weight.T, targets) for hidden (..., d), weight (vocab, d), targets (...): the
    logits are made in `compute_dtype` (default: hidden's dtype), the loss is accumulated in fp32.
    With `ignore_index`, targets equal to it count for nothing (F.cross_entropy's ignore_index): the mean is over
    the others, and is 0 where there are none. `buffers`: where a loss without a gradient (and without
    `ignore_index`) makes its chunks' tensors, uncompiled (HeadBuffers)."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be mean or sum, got {reduction!r}")
    h = hidden.reshape(-1, hidden.shape[-1])
    y = targets.reshape(-1)
    if not torch.is_grad_enabled():  # (the Function sees its inputs' requires_grad, not the grad mode)
        h, weight = h.detach(), weight.detach()
    if ignore_index is None:
        chunk_fn = compiled_chunk_loss() if compiled else _chunk_loss
    else:
        chunk_fn = compiled_once(_weighted_chunk_loss) if compiled else _weighted_chunk_loss
    if compiled:
        buffers = None
    dtype = compute_dtype or hidden.dtype
    return _LinearCrossEntropy.apply(h, weight, y, dtype, reduction, chunk_fn, ignore_index, buffers)
