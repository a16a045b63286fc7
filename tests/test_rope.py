"""RoPE without a rounding of its own changed: the uncompiled layer's rotation (model.rotate_pairs, q and k together
where the matmul wrote them) equals apply_rope to the bit, forward and backward, in fp32 and bf16."""

import pytest
import torch

from ilr_search.config import ModelConfig
from ilr_search.training.model import (
    ILRTransformer,
    apply_rope,
    members_hidden,
    position_tables,
    rope_rotation,
    rope_tables,
    rotate_pairs,
    schedule_positions,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_size", [8, 64])
def test_rotate_pairs_equals_apply_rope_to_the_bit(dtype, head_size):
    torch.manual_seed(0)
    T, heads = 16, 5
    cos, sin = rope_tables(T, head_size, 10000.0, torch.device("cpu"))
    cos2, sin2, _ = rope_rotation((cos, sin), False)
    x0 = torch.randn(2, T, heads, head_size).to(dtype)
    grads = []
    for rotate in (
        lambda x: apply_rope(x.transpose(1, 2), cos, sin).transpose(1, 2),  # apply_rope takes (N, heads, T, size)
        lambda x: rotate_pairs(x, cos2, sin2),
    ):
        x = x0.clone().requires_grad_()
        y = rotate(x)
        (y.float() * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        grads.append((y.detach(), x.grad))
    (y_ref, g_ref), (y, g) = grads
    assert y.dtype == dtype and torch.equal(y, y_ref) and torch.equal(g, g_ref)


@pytest.mark.parametrize(
    "options",
    [{"d_model": 16, "n_heads": 2}, {"d_model": 64, "n_heads": 4, "n_kv_heads": 2}, {"d_model": 128, "n_heads": 2}],
)
def test_the_layers_rotation_equals_apply_ropes_to_the_bit(options):
    """A model's forward pass and gradients with the rotation tables (uncompiled) and without (apply_rope in attend):
    multi-head and grouped-query attention, head sizes 8, 16 and 64."""
    cfg = ModelConfig(vocab_size=64, n_layers=2, seq_len=16, **options)
    torch.manual_seed(1)
    model = ILRTransformer(cfg)
    x = torch.randint(0, 64, (1, 3, 16))
    positions = schedule_positions(cfg, [[0, 1, 1]])
    results = []
    for rotation in (False, True):
        model.zero_grad()
        tables = position_tables(cfg, 16, torch.device("cpu"), rotation=rotation)
        h = members_hidden(cfg, x, model.member_params(), model.layer_weights, positions, tables)
        h.square().sum().backward()
        results.append([h.detach()] + [p.grad.clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))
