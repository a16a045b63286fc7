"""Recurrence knobs: each equals a hand-written forward pass, trains, and adds no FLOPs and few parameters."""

import math

import pytest
import torch
import torch.nn.functional as F

from ilr_search.config import ModelConfig, TrainConfig
from ilr_search.knobs import acting_knobs, format_knobs, knobs_of, with_knobs
from ilr_search.training.flops import count_flops, forward_flops_per_token, param_count
from ilr_search.training.model import ILRTransformer, attend, branch_scales, repeat_indices
from ilr_search.training.schedule import block_schedule, parse_keyed_map, reuse_map_schedule
from ilr_search.training.train import build_optimizer, set_lr, weight_decays

ENCODINGS = ["nope", "rope", "learned", "alibi"]
KNOB_CONFIGS = {
    "injection=add": {"injection": "add"},
    "injection=gated": {"injection": "gated"},
    "iteration_encoding": {"iteration_encoding": True},
    "iteration_norms": {"iteration_norms": True},
    "init_depth": {"init_depth": 12},
    "all": {"injection": "gated", "iteration_encoding": True, "iteration_norms": True, "init_depth": 12},
    "repeat_scale=residual": {"repeat_scale": "residual"},
    "repeat_scale=lr": {"repeat_scale": "lr"},  # the forward pass is the plain one; the lr is tested below
    "all+residual": {
        "injection": "gated",
        "iteration_encoding": True,
        "iteration_norms": True,
        "init_depth": 12,
        "repeat_scale": "residual",
    },
    "damping=0.5": {"damping": 0.5},
    "damping=0.25+residual": {"damping": 0.25, "repeat_scale": "residual"},
}
SCHEDULE = reuse_map_schedule([3, 1, 2])  # [0, 0, 0, 1, 2, 2]


def tiny(pe: str = "rope", **kw) -> ModelConfig:
    return ModelConfig(vocab_size=64, n_layers=3, d_model=16, n_heads=2, seq_len=8, pe=pe, max_reuse=3, **kw)


def randomize_knobs(model: ILRTransformer) -> None:
    """Knob parameters start as a no-op (gates 0, encodings 0, gains 1); move them so the test sees them act."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name in ("injection_gates", "iteration_embed", "iteration_norm_gains"):
            p = getattr(model, name)
            if p is not None:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if name == "iteration_norm_gains" else 0.0))


def attention_by_hand(layer, h: torch.Tensor, rope, alibi) -> torch.Tensor:
    """A layer's attention on normed h (B, T, D), from its parameters (the heads split as nn.Linear writes them)."""
    B, T, _ = h.shape
    a = layer.attn
    q, k, v = F.linear(h, a.qkv.weight, a.qkv.bias).split((a.q_dim, a.kv_dim, a.kv_dim), dim=-1)
    head_size = a.q_dim // layer.n_heads
    q = q.view(B, T, layer.n_heads, head_size).transpose(1, 2)
    k = k.view(B, T, -1, head_size).transpose(1, 2)
    v = v.view(B, T, -1, head_size).transpose(1, 2)
    return F.linear(attend(q, k, v, rope, alibi), a.proj.weight)


def mlp_by_hand(layer, h: torch.Tensor) -> torch.Tensor:
    gate, up = F.linear(h, layer.mlp.gate_up.weight).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, layer.mlp.down.weight)


def reference_logits(model: ILRTransformer, idx: torch.Tensor, schedule: list[int]) -> torch.Tensor:
    """The knobs written out by hand from their description, with the layers' parts computed one by one."""
    cfg = model.cfg
    T = idx.shape[1]
    e = model.embed.weight[idx]
    if cfg.pe == "learned":
        e = e + model.pos_embed.weight[:T]
    rope, alibi = None, None
    if cfg.pe == "rope":
        from ilr_search.training.model import rope_tables

        rope = rope_tables(T, cfg.head_size, cfg.rope_base, idx.device)
    if cfg.pe == "alibi":
        from ilr_search.training.model import alibi_bias

        alibi = alibi_bias(cfg.n_heads, T, idx.device)
    x = e
    runs: dict[int, int] = {}
    for layer_index in schedule:
        # repeat_scale residual: a layer that runs r times in the schedule adds each pass's branches times 1 / r
        branch = 1.0 / schedule.count(layer_index) if cfg.repeat_scale == "residual" else 1.0
        k = runs.get(layer_index, 0)
        # damping: every pass after the layer's first adds its branches times a
        if k >= 1:
            branch *= cfg.damping
        runs[layer_index] = k + 1
        layer = model.layers[layer_index]
        if k >= 1 and cfg.injection == "add":
            x = x + e
        if k >= 1 and cfg.injection == "gated":
            x = x + model.injection_gates[layer_index] * e
        if cfg.iteration_encoding:
            x = x + model.iteration_embed[k]
        g_attn, g_mlp = layer.attn_norm.weight, layer.mlp_norm.weight
        if cfg.iteration_norms and k >= 1:
            g_attn, g_mlp = model.iteration_norm_gains[layer_index, k - 1]

        def rms(v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
            return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * g

        x = x + branch * attention_by_hand(layer, rms(x, g_attn), rope, alibi)
        x = x + branch * mlp_by_hand(layer, rms(x, g_mlp))
    return F.linear(model.norm(x), model.embed.weight)


def test_repeat_indices_count_earlier_runs_of_the_same_layer():
    assert repeat_indices([0, 0, 0, 1, 2, 2]) == [0, 1, 2, 0, 0, 1]
    assert repeat_indices(block_schedule(3, 2)) == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize("pe", ENCODINGS)
@pytest.mark.parametrize("knob", list(KNOB_CONFIGS))
def test_each_knob_equals_the_hand_written_forward_pass(knob, pe):
    cfg = tiny(pe, **KNOB_CONFIGS[knob])
    torch.manual_seed(0)
    model = ILRTransformer(cfg).eval()
    randomize_knobs(model)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    for schedule in (SCHEDULE, block_schedule(3, 2), [0, 1, 2]):
        torch.testing.assert_close(model(idx, schedule), reference_logits(model, idx, schedule), rtol=1e-4, atol=1e-5)


def test_knobs_at_their_initial_values_are_the_plain_model():
    """Gates start at 0, encodings at 0, per-repeat gains at 1: with the same weights, gated injection,
    iteration encoding and iteration norms begin as the model the paper ran."""
    torch.manual_seed(0)
    plain = ILRTransformer(tiny()).eval()
    knobbed = ILRTransformer(tiny(injection="gated", iteration_encoding=True, iteration_norms=True)).eval()
    missing, unexpected = knobbed.load_state_dict(plain.state_dict(), strict=False)
    assert sorted(missing) == ["injection_gates", "iteration_embed", "iteration_norm_gains"] and not unexpected
    idx = torch.randint(0, 64, (2, 8))
    torch.testing.assert_close(knobbed(idx, SCHEDULE), plain(idx, SCHEDULE))
    # and injection "add" is not: it changes the function from the first step
    added = ILRTransformer(tiny(injection="add")).eval()
    added.load_state_dict(plain.state_dict())
    assert not torch.allclose(added(idx, SCHEDULE), plain(idx, SCHEDULE))


@pytest.mark.parametrize("knob", ["injection=gated", "iteration_encoding", "iteration_norms"])
def test_gradients_reach_the_knob_parameters(knob):
    torch.manual_seed(0)
    model = ILRTransformer(tiny(**KNOB_CONFIGS[knob]))
    idx = torch.randint(0, 64, (2, 8))
    model.loss(idx, idx.roll(-1, 1), SCHEDULE).backward()
    grads = {
        name: p.grad
        for name, p in model.named_parameters()
        if name in ("injection_gates", "iteration_embed", "iteration_norm_gains")
    }
    assert len(grads) == 1
    ((name, grad),) = grads.items()
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name
    if name == "injection_gates":  # layer 1 runs once in [3, 1, 2]: its gate is never used
        assert grad[0] != 0 and grad[1] == 0 and grad[2] != 0
    if name == "iteration_embed":  # repeats 0, 1, 2 all occur in the schedule
        assert (grad.abs().sum(-1) > 0).all()


@pytest.mark.parametrize("pe", ENCODINGS)
@pytest.mark.parametrize("knob", list(KNOB_CONFIGS))
def test_knobs_add_no_flops_the_counter_sees(knob, pe):
    cfg = tiny(pe, **KNOB_CONFIGS[knob])
    torch.manual_seed(0)
    model = ILRTransformer(cfg)
    randomize_knobs(model)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    for schedule in (SCHEDULE, block_schedule(3, 3)):
        counted = count_flops(model, idx, schedule) / idx.numel()
        analytic = forward_flops_per_token(cfg, schedule)
        assert abs(counted - analytic) / analytic < 0.01, (knob, pe, counted, analytic)


def test_parameters_grow_only_by_each_knobs_own():
    base = param_count(tiny())
    L, d, R = 3, 16, 3
    assert param_count(tiny(injection="add")) == base
    assert param_count(tiny(injection="gated")) == base + L
    assert param_count(tiny(iteration_encoding=True)) == base + R * d
    assert param_count(tiny(iteration_norms=True)) == base + L * (R - 1) * 2 * d
    assert param_count(tiny(init_depth=12)) == base


def test_depth_aware_init_scales_the_residual_projections():
    def proj_std(init_depth: int) -> float:
        torch.manual_seed(0)
        m = ILRTransformer(
            ModelConfig(vocab_size=64, n_layers=2, d_model=128, n_heads=2, seq_len=8, init_depth=init_depth)
        )
        return (
            torch.cat(
                [m.layers[i].attn.proj.weight.flatten() for i in range(2)]
                + [m.layers[i].mlp.down.weight.flatten() for i in range(2)]
            )
            .std()
            .item()
        )

    assert proj_std(0) == pytest.approx(0.02 / math.sqrt(2 * 2), rel=0.03)
    assert proj_std(8) == pytest.approx(0.02 / math.sqrt(2 * 8), rel=0.03)


def test_a_schedule_deeper_than_the_tables_is_refused():
    model = ILRTransformer(tiny(iteration_encoding=True))
    with pytest.raises(ValueError, match="max_reuse 3"):
        model(torch.zeros(1, 8, dtype=torch.long), [0, 0, 0, 0, 1, 2])


def test_knob_settings_round_trip_through_the_config():
    cfg = with_knobs(tiny(), {"injection": "add", "depth_init": True, "iteration_norms": False}, init_depth=9)
    assert (cfg.injection, cfg.init_depth, cfg.iteration_norms) == ("add", 9, False)
    assert knobs_of(cfg) == {
        "injection": "add",
        "iteration_encoding": False,
        "iteration_norms": False,
        "depth_init": True,
        "repeat_scale": "off",
        "damping": 1.0,
        "adapters": 0,
        "capacity": 1.0,
    }
    assert format_knobs(knobs_of(cfg)) == "injection=add,depth_init"
    assert format_knobs(knobs_of(tiny())) == ""
    with pytest.raises(ValueError, match="unknown knob"):
        with_knobs(tiny(), {"loras": True}, init_depth=9)


# --- repeat_scale: a layer that runs r times, scaled by 1 / r ---


def test_repeat_scale_residual_scales_each_repeated_layers_branches_by_its_run_count():
    # per position of [0, 0, 0, 1, 2, 2]
    assert branch_scales(tiny(repeat_scale="residual"), SCHEDULE) == [1 / 3, 1 / 3, 1 / 3, None, 0.5, 0.5]
    assert branch_scales(tiny(repeat_scale="residual"), block_schedule(3, 2)) == [0.5] * 6
    for setting in ("off", "lr"):
        assert branch_scales(tiny(repeat_scale=setting), SCHEDULE) == [None] * 6
    # one layer by hand: x (a residual stream) plus half of each branch, against the layer's plain branches
    torch.manual_seed(0)
    layer = ILRTransformer(tiny()).layers[0]
    x = torch.randn(2, 8, 16)
    attn = attention_by_hand(layer, layer.attn_norm(x), None, None)
    half = x + 0.5 * attn
    torch.testing.assert_close(layer(x, branch_scale=0.5), half + 0.5 * mlp_by_hand(layer, layer.mlp_norm(half)))
    assert torch.equal(layer(x), layer(x, branch_scale=None))


@pytest.mark.parametrize("setting", ["residual", "lr"])
def test_repeat_scale_leaves_the_baseline_bit_for_bit_and_changes_a_recurrent_map(token_cache, setting):
    """Every layer of the all-ones map runs once (r = 1): no setting touches it. A map with repeats trains
    otherwise."""
    from ilr_search.config import DataConfig, TrainConfig
    from ilr_search.data.tokens import load_tokens
    from ilr_search.training.train import train_proxy

    data = load_tokens(DataConfig(), root=token_cache)
    cfg = TrainConfig(
        steps=12,
        batch_size=4,
        lr=3e-3,
        eval_fractions=(0.5, 1.0),
        eval_windows=4,
        dtype="fp32",
        device="cpu",
        checkpoint_every=0,
    )
    model_cfg = ModelConfig(vocab_size=256, n_layers=3, d_model=16, n_heads=2, seq_len=32)
    for schedule, same in (([0, 1, 2], True), (SCHEDULE, False)):
        off = train_proxy(model_cfg, schedule, data, cfg)
        scaled = train_proxy(with_knobs(model_cfg, {"repeat_scale": setting}, init_depth=6), schedule, data, cfg)
        assert ([p.val_loss for p in scaled.curve] == [p.val_loss for p in off.curve]) is same, (schedule, setting)


def test_repeat_scale_lr_puts_each_repeated_layers_parameters_at_lr_over_r():
    cfg = TrainConfig(lr=1e-2, steps=10, warmup_frac=0.1)
    torch.manual_seed(0)
    model = ILRTransformer(tiny(repeat_scale="lr"))
    optimizer = build_optimizer(model, cfg, torch.device("cpu"), SCHEDULE)  # layer 0 runs 3 times, 2 twice
    set_lr(optimizer, 1, cfg)
    lr_of = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
    decay_of = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    expected = {0: cfg.lr / 3, 1: cfg.lr, 2: cfg.lr / 2}
    for name, p in model.named_parameters():
        layer = int(name.split(".")[1]) if name.startswith("layers.") else 1
        assert lr_of[id(p)] == pytest.approx(expected[layer]), name
        assert decay_of[id(p)] == (cfg.weight_decay if weight_decays(name, p) else 0.0), name
    assert len(lr_of) == len(list(model.parameters()))
    # off (or no schedule): the two groups the optimizer always had, at the schedule's lr
    for plain in (
        build_optimizer(ILRTransformer(tiny()), cfg, torch.device("cpu"), SCHEDULE),
        build_optimizer(model, cfg, torch.device("cpu")),
    ):
        set_lr(plain, 1, cfg)
        assert [g["weight_decay"] for g in plain.param_groups] == [cfg.weight_decay, 0.0]
        assert all("lr_scale" not in g and g["lr"] == cfg.lr for g in plain.param_groups)
    # AdamW's first step moves every element by about its lr (m / sqrt(v) = g / |g|): a third for layer 0
    idx = torch.randint(0, 64, (2, 8))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.loss(idx, idx.roll(-1, 1), SCHEDULE).backward()
    optimizer.step()
    step = {n: (p.detach() - before[n]).abs().median().item() for n, p in model.named_parameters()}
    for layer, r in ((0, 3), (1, 1), (2, 2)):
        assert step[f"layers.{layer}.attn.qkv.weight"] == pytest.approx(cfg.lr / r, rel=0.05), layer


# --- damping: every pass after a layer's first adds its branches times a ---


def test_damping_scales_the_passes_after_each_layers_first():
    assert branch_scales(tiny(damping=0.5), SCHEDULE) == [None, 0.5, 0.5, None, None, 0.5]
    assert branch_scales(tiny(damping=0.5), block_schedule(3, 2)) == [None, None, None, 0.5, 0.5, 0.5]
    assert branch_scales(tiny(damping=0.5), [0, 1, 2]) == [None, None, None]
    assert branch_scales(tiny(damping=0.5, repeat_scale="residual"), [0, 0, 1, 2]) == [0.5, 0.25, None, None]


def test_damping_one_is_the_plain_repeat_bit_for_bit():
    torch.manual_seed(0)
    plain = ILRTransformer(tiny()).eval()
    damped = ILRTransformer(tiny(damping=1.0)).eval()
    damped.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 64, (2, 8))
    for schedule in (SCHEDULE, block_schedule(3, 2), [0, 1, 2]):
        assert torch.equal(plain(idx, schedule), damped(idx, schedule))
    half = ILRTransformer(tiny(damping=0.5)).eval()
    half.load_state_dict(plain.state_dict())
    assert torch.equal(plain(idx, [0, 1, 2]), half(idx, [0, 1, 2]))  # no repeat, nothing damped
    assert not torch.allclose(plain(idx, SCHEDULE), half(idx, SCHEDULE))


def test_damping_is_a_knob_that_takes_any_value_in_zero_one():
    from ilr_search.knobs import config_key, parse_knob_settings

    assert parse_knob_settings("damping=0.3") == {"damping": 0.3}
    assert parse_knob_settings("damping=off") == {"damping": 1.0}
    assert config_key("block:1-2:2", {"damping": 0.25}) == "block:1-2:2|damping=0.25"
    assert config_key("2,1,1", {"damping": 1.0}) == "2,1,1"
    for bad in ("damping=0", "damping=1.5", "damping=x", "damping"):
        with pytest.raises(ValueError, match="damping"):
            parse_knob_settings(bad)
    with pytest.raises(ValueError, match="damping"):
        ModelConfig(damping=0.0)
    assert forward_flops_per_token(tiny(damping=0.5), SCHEDULE) == forward_flops_per_token(tiny(), SCHEDULE)


def test_a_repeat_factor_on_a_map_that_repeats_no_layer_is_dropped():
    """damping and repeat_scale act on the passes of a repeated layer only: on a map that repeats none they are
    dropped, so that the plain map with damping is the plain map (one key, one evaluation); other knobs stay."""
    assert acting_knobs({"damping": 0.5, "repeat_scale": "residual", "injection": "add"}, [0, 1, 2]) == {
        "injection": "add"
    }
    assert acting_knobs({"damping": 0.5}, [0, 0, 1, 2]) == {"damping": 0.5}
    assert parse_keyed_map("1,1,1|damping=0.1", 3, "here").knob_settings == {}
    assert parse_keyed_map("2,1,1|damping=0.1", 3, "here").knob_settings == {"damping": 0.1}
    assert parse_keyed_map("block:1-2:2|damping=0.5", 3, "here").knob_settings == {"damping": 0.5}


def test_a_map_whose_adapters_the_budget_does_not_pay_for_is_repaired_to_fit_at_that_rank():
    # The adapters' matmuls cost FLOPs: 2,2,1,1 is at the edge of 1.5x on a 4-layer d32 model, where rank 16 took
    # 1.68x and stopped a `--knobs adapters` study (an assertion in trial_groups.propose). The map is repaired again
    # by what its passes cost with the adapters on (search.maps.fit_map), keeping the rank the sampler drew.
    from ilr_search.search.maps import fit_map
    from ilr_search.training.flops import flops_ratio, parse_budget
    from ilr_search.training.schedule import Map

    cfg = ModelConfig(n_layers=4, d_model=32, n_heads=2, seq_len=64, vocab_size=256, max_reuse=3)
    budget, ranked = parse_budget("1.5x", cfg), with_knobs(cfg, {"adapters": 16}, 6)
    edge, inside = Map.parse("2,2,1,1", 4), Map.parse("2,1,1,1", 4)
    assert not budget.allows(flops_ratio(ranked, edge.schedule()))
    fitted = fit_map(edge, budget.pass_costs(ranked))
    assert budget.allows(flops_ratio(ranked, fitted.schedule())) and fitted != edge and not fitted.is_baseline
    assert fit_map(inside, budget.pass_costs(ranked)) == inside  # in budget: unchanged
