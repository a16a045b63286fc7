"""The fused, chunked head + cross-entropy against F.cross_entropy, and the trainer's host syncs."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ilr_search.config import DataConfig, ModelConfig, TrainConfig
from ilr_search.data.tokens import load_tokens
from ilr_search.training import loss as loss_module
from ilr_search.training.loss import linear_cross_entropy
from ilr_search.training.model import ILRTransformer
from ilr_search.training.schedule import reuse_map_schedule
from ilr_search.training.train import SYNC_EVERY, train_proxy


def _reference(h, w, y, dtype, reduction):
    autocast = torch.autocast(h.device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)
    with autocast:
        return F.cross_entropy(F.linear(h, w).float(), y, reduction=reduction)


# On a CUDA machine (benchmarks/gpu_check.sh) the compiled head is checked too.
DEVICES = [("cpu", False)] + ([("cuda", False), ("cuda", True)] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device,compiled", DEVICES)
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_fused_loss_and_gradients_equal_cross_entropy(monkeypatch, dtype, rtol, reduction, device, compiled):
    monkeypatch.setattr(loss_module, "LOGITS_PER_CHUNK", 97 * 64)  # several chunks, the last one short
    torch.manual_seed(0)
    vocab, n, d = 97, 300, 24
    h0, w0 = torch.randn(n, d, device=device), torch.randn(vocab, d, device=device) * 0.2
    y = torch.randint(0, vocab, (n,), device=device)
    results = []
    for fn in (
        lambda h, w: _reference(h, w, y, dtype, reduction),
        lambda h, w: linear_cross_entropy(h, w, y, dtype, reduction, compiled=compiled),
    ):
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        out = fn(h, w)
        (out * 1.7).backward()  # an upstream gradient other than 1 must be carried through
        results.append((out.detach(), h.grad, w.grad))
    (ref, ref_gh, ref_gw), (got, gh, gw) = results
    assert got.dtype == torch.float32 and got.device.type == device and gh.dtype == h0.dtype and gw.dtype == w0.dtype
    torch.testing.assert_close(got, ref, rtol=rtol, atol=1e-6)
    scale = 1.0 if dtype == torch.float32 else ref_gh.abs().max().item()
    torch.testing.assert_close(gh, ref_gh, rtol=rtol, atol=rtol * scale)
    torch.testing.assert_close(gw, ref_gw, rtol=rtol, atol=rtol * ref_gw.abs().max().item())


def test_model_loss_equals_logits_cross_entropy_and_keeps_no_gradient_without_grad():
    cfg = ModelConfig(vocab_size=50, n_layers=2, d_model=16, n_heads=2, seq_len=12)
    torch.manual_seed(1)
    model = ILRTransformer(cfg)
    x, y = torch.randint(0, 50, (3, 12)), torch.randint(0, 50, (3, 12))
    schedule = reuse_map_schedule([2, 1])
    ref = F.cross_entropy(model(x, schedule).flatten(0, 1), y.flatten())
    torch.testing.assert_close(model.loss(x, y, schedule), ref)
    with torch.no_grad():
        assert not model.loss(x, y, schedule).requires_grad


class CountScalarReads(TorchDispatchMode):
    """Counts reads of tensor values into the host: `.item()` and `float(t)` (aten._local_scalar_dense) and
    copies to the CPU (aten._to_copy with device cpu, what `.cpu()` runs on CUDA). On CUDA each one waits for
    the device (a host sync)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default or (
            func is torch.ops.aten._to_copy.default and kwargs.get("device") == torch.device("cpu")
        ):
            self.reads += 1
        return func(*args, **kwargs)


def _reads(tokens, steps: int) -> int:
    model = ModelConfig(vocab_size=256, n_layers=2, d_model=16, n_heads=2, seq_len=32)
    cfg = TrainConfig(steps=steps, batch_size=2, eval_windows=2, dtype="fp32", device="cpu", eval_fractions=(1.0,))
    with CountScalarReads() as counter:
        result = train_proxy(model, reuse_map_schedule([1, 1]), tokens, cfg)
    assert result.status == "ok" and len(result.curve) == 1
    return counter.reads


@pytest.mark.slow
def test_training_reads_the_loss_once_per_window_not_once_per_step(token_cache):
    """No host sync per step: 3 x SYNC_EVERY more steps between evaluations add at most 3 reads (one per
    step would add 48)."""
    tokens = load_tokens(DataConfig(), root=token_cache)
    short, long = SYNC_EVERY, 4 * SYNC_EVERY
    extra = _reads(tokens, long) - _reads(tokens, short)
    assert 0 < extra <= (long - short) // SYNC_EVERY, f"{extra} value reads for {long - short} more steps"


def _cuda_syncs(tokens, steps: int) -> int:
    import warnings

    model = ModelConfig(vocab_size=256, n_layers=2, d_model=64, n_heads=2, seq_len=64)
    cfg = TrainConfig(steps=steps, batch_size=8, eval_windows=8, dtype="bf16", device="cuda", eval_fractions=(1.0,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = train_proxy(model, reuse_map_schedule([2, 1]), tokens, cfg)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert result.status == "ok"
    return sum("synchroniz" in str(w.message) for w in caught)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (benchmarks/gpu_check.sh runs it)")
def test_cuda_training_syncs_once_per_window_bf16_compiled(token_cache):
    """On CUDA, bf16 and compiled layers: CUDA's own sync detector counts the synchronising calls."""
    tokens = load_tokens(DataConfig(), root=token_cache)
    _cuda_syncs(tokens, SYNC_EVERY)  # compiles once
    short, long = SYNC_EVERY, 4 * SYNC_EVERY
    extra = _cuda_syncs(tokens, long) - _cuda_syncs(tokens, short)
    assert extra <= (long - short) // SYNC_EVERY, f"{extra} synchronising calls for {long - short} more steps"


def test_without_grad_mode_the_head_computes_no_gradients():
    """Evaluation (torch.no_grad) of a head whose weight is a Parameter: only the forward matmul's FLOPs, not the two
    matmuls of its gradients (the Function sees its inputs' requires_grad, not the grad mode)."""
    from torch.utils.flop_counter import FlopCounterMode

    n, d, vocab = 64, 32, 1000
    h = torch.randn(n, d)
    w = torch.nn.Parameter(torch.randn(vocab, d))
    y = torch.randint(0, vocab, (n,))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        linear_cross_entropy(h, w, y, reduction="sum")
    assert counter.get_total_flops() == 2 * n * d * vocab
    with FlopCounterMode(display=False) as counter:
        linear_cross_entropy(h, w, y, reduction="sum")
    assert counter.get_total_flops() == 3 * 2 * n * d * vocab  # with grad mode: forward and both gradients


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_buffers_give_the_same_losses_to_the_bit(dtype):
    """The frozen evaluator's reused logits (HeadBuffers): the same kernels into kept tensors, the same losses,
    whatever the rows' sizes in turn (a buffer grows, a smaller chunk takes its front)."""
    torch.manual_seed(2)
    vocab, d = 517, 48
    w = (torch.randn(vocab, d) * 0.2).to(dtype)
    buffers = loss_module.HeadBuffers()
    with torch.no_grad():
        for n in (64, 200, 7, 200):
            h, y = torch.randn(n, d).to(dtype), torch.randint(0, vocab, (n,))
            plain = linear_cross_entropy(h, w, y, dtype, "sum")
            assert torch.equal(linear_cross_entropy(h, w, y, dtype, "sum", buffers=buffers), plain)
