import pytest
import torch
from conftest import assert_one_line_error
from torch.nn.attention import SDPBackend, sdpa_kernel

from ilr_search.config import ModelConfig
from ilr_search.training.flops import (
    BudgetError,
    count_flops,
    flops_ratio,
    forward_flops_per_token,
    param_count,
    parse_budget,
)
from ilr_search.training.model import ILRTransformer
from ilr_search.training.schedule import Map, ScheduleError, block_schedule, reuse_map_schedule

ENCODINGS = ["nope", "rope", "learned", "alibi"]
SCHEDULES = {
    "1,1,1,1": reuse_map_schedule([1, 1, 1, 1]),
    "2,1,1,1": reuse_map_schedule([2, 1, 1, 1]),
    "4,2,1,1": reuse_map_schedule([4, 2, 1, 1]),
    "block2": block_schedule(4, 2),
}


def tiny(pe: str, **kw) -> ModelConfig:
    return ModelConfig(vocab_size=256, n_layers=4, d_model=32, n_heads=4, seq_len=16, pe=pe, **kw)


@pytest.mark.parametrize("pe", ENCODINGS)
def test_analytic_flops_match_flop_counter(pe):
    cfg = tiny(pe)
    torch.manual_seed(0)
    model = ILRTransformer(cfg)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    params = set()
    for name, schedule in SCHEDULES.items():
        counted = count_flops(model, x, schedule) / x.numel()
        analytic = forward_flops_per_token(cfg, schedule)
        assert abs(counted - analytic) / analytic < 0.01, (pe, name, counted, analytic)
        # the math backend decomposes attention into matmuls: the count is the same
        with sdpa_kernel(SDPBackend.MATH):
            assert abs(count_flops(model, x, schedule) / x.numel() - analytic) / analytic < 0.01
        params.add(model.num_params())
    assert params == {param_count(cfg)}


# The options of pretrained architectures (training/pretrained.py), alone and together.
ARCHITECTURE_OPTIONS = [
    {"n_kv_heads": 2},
    {"n_kv_heads": 1},
    {"head_dim": 12},
    {"tie_embeddings": False},
    {"qkv_bias": True},
    {"qk_norm": True},
    {"n_kv_heads": 2, "head_dim": 6, "tie_embeddings": False, "qkv_bias": True, "qk_norm": True},
]


@pytest.mark.parametrize("kw", ARCHITECTURE_OPTIONS)
def test_analytic_flops_and_params_of_the_architecture_options(kw):
    cfg = tiny("rope", **kw)
    torch.manual_seed(0)
    model = ILRTransformer(cfg)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    for name, schedule in SCHEDULES.items():
        counted = count_flops(model, x, schedule) / x.numel()
        analytic = forward_flops_per_token(cfg, schedule)
        assert abs(counted - analytic) / analytic < 0.01, (kw, name, counted, analytic)
    assert param_count(cfg) == model.num_params()


def test_the_architecture_options_change_the_count_as_their_shapes_say():
    base = tiny("rope")
    D, L, V = 32, 4, 256
    assert param_count(tiny("rope", tie_embeddings=False)) == param_count(base) + V * D
    assert forward_flops_per_token(tiny("rope", tie_embeddings=False), range(L)) == forward_flops_per_token(
        base, range(L)
    )
    assert param_count(tiny("rope", qk_norm=True)) == param_count(base) + L * 2 * 8
    assert param_count(tiny("rope", qkv_bias=True)) == param_count(base) + L * 3 * D
    assert param_count(tiny("rope", n_kv_heads=2)) == param_count(base) - L * 2 * D * (D // 2)
    assert param_count(tiny("rope", head_dim=8)) == param_count(base)  # 4 heads of 8 = d_model: the default


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"mlp_ratio": 2.5},
        {"injection": "gated", "max_reuse": 3},
        {"injection": "add"},
        {"iteration_encoding": True, "max_reuse": 4},
        {"iteration_norms": True, "max_reuse": 3},
        {"iteration_norms": True, "max_reuse": 1},
    ],
)
@pytest.mark.parametrize("pe", ENCODINGS)
def test_parameter_count_equals_the_built_models(pe, kw):
    cfg = tiny(pe, **kw)
    assert param_count(cfg) == ILRTransformer(cfg).num_params()


def test_parameter_count_independent_of_schedule_and_only_learned_adds_params():
    counts = {pe: param_count(tiny(pe)) for pe in ENCODINGS}
    assert counts["nope"] == counts["rope"] == counts["alibi"]
    assert counts["learned"] == counts["nope"] + 16 * 32


@pytest.mark.parametrize("pe", ENCODINGS)
def test_reuse_map_equals_running_the_layer_by_hand(pe):
    cfg = tiny(pe)
    torch.manual_seed(1)
    model = ILRTransformer(cfg).eval()
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    with torch.no_grad():
        h = model.embed(x)
        if model.pos_embed is not None:
            h = h + model.pos_embed(torch.arange(cfg.seq_len))
        from ilr_search.training.model import alibi_bias, rope_tables

        rope = rope_tables(cfg.seq_len, cfg.head_size, cfg.rope_base, x.device) if pe == "rope" else None
        alibi = alibi_bias(cfg.n_heads, cfg.seq_len, x.device) if pe == "alibi" else None
        plain = h
        for layer in model.layers:
            plain = layer(plain, rope, alibi)
        twice = model.layers[0](model.layers[0](h, rope, alibi), rope, alibi)
        for layer in model.layers[1:]:
            twice = layer(twice, rope, alibi)

        def head(z):
            return torch.nn.functional.linear(model.norm(z), model.embed.weight)

        torch.testing.assert_close(model(x, [0, 0, 1, 2, 3]), head(twice))
        torch.testing.assert_close(model(x, reuse_map_schedule([1, 1, 1, 1])), head(plain))
        torch.testing.assert_close(model(x), head(plain))
        assert not torch.allclose(model(x, [0, 0, 1, 2, 3]), model(x))


@pytest.mark.parametrize("pe", ENCODINGS)
def test_gradients_reach_every_parameter(pe):
    cfg = tiny(pe)
    model = ILRTransformer(cfg)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    loss = torch.nn.functional.cross_entropy(model(x, reuse_map_schedule([2, 1, 1, 3])).flatten(0, 1), x.flatten())
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_alibi_bias_is_causal():
    from ilr_search.training.model import alibi_bias

    bias = alibi_bias(4, 5, torch.device("cpu"))
    assert torch.isinf(bias[:, 0, 1:]).all() and torch.isfinite(bias[:, 4]).all()
    assert (bias[:, 3, 3] == 0).all() and (bias[:, 3, 0] < bias[:, 3, 2]).all()


def test_flops_ratio_grows_with_recurrence():
    cfg = tiny("rope")
    assert flops_ratio(cfg, reuse_map_schedule([1, 1, 1, 1])) == 1.0
    r2 = flops_ratio(cfg, reuse_map_schedule([2, 1, 1, 1]))
    assert 1.2 < r2 < 1.25  # one extra layer of four, diluted by the LM head
    assert flops_ratio(cfg, block_schedule(4, 2)) == flops_ratio(cfg, reuse_map_schedule([2, 2, 2, 2]))


GOOD_BUDGETS = [("1.5x", 1.5), ("150%", 1.5), ("1x", 1.0), ("2.0X", 2.0), (" 1.25x ", 1.25)]
BAD_BUDGETS = ["abc", "0x", "-1x", "", "nanx", "inf", "0.5x", "50%", "1e3", "x", "1.5xx", "1,5x"]


@pytest.mark.parametrize("text,ratio", GOOD_BUDGETS)
def test_good_budgets(text, ratio):
    assert parse_budget(text, tiny("rope")).ratio == pytest.approx(ratio)


def test_absolute_budget():
    cfg = tiny("rope")
    base = forward_flops_per_token(cfg, range(4))
    budget = parse_budget(f"{1.5 * base:.6e}", cfg)
    assert budget.ratio == pytest.approx(1.5, rel=1e-6)


@pytest.mark.parametrize("text", BAD_BUDGETS)
def test_bad_budgets(text):
    with pytest.raises(BudgetError):
        parse_budget(text, tiny("rope"))


@pytest.mark.parametrize(
    "text,layers", [("0,1,1,1", 4), ("1,1", 4), ("1.5,1,1,1", 4), ("a,b", 2), ("", 1), ("-1,2", 2)]
)
def test_bad_maps(text, layers):
    with pytest.raises(ScheduleError):
        Map.parse(text, layers)


def test_good_map():
    assert Map.parse(" 4, 2,1,1", 4).counts == (4, 2, 1, 1)


def test_flops_cli_contract(cli):
    import json

    # in this process (test_console_script_bad_input_is_one_error_line runs the console script itself)
    proc = cli("flops", "--layers", "4", "--reuse-map", "2,1,1,1", "--json", check=True)
    report = json.loads(proc.stdout)
    assert set(report) >= {
        "reuse_map",
        "schedule",
        "params",
        "flops_per_token",
        "baseline_flops_per_token",
        "flops_ratio",
        "train_flops",
    }
    assert report["schedule"] == [0, 0, 1, 2, 3] and report["flops_ratio"] > 1
    block = json.loads(cli("flops", "--layers", "4", "--block", "2", "--json", check=True).stdout)
    assert block["schedule"] == [0, 1, 2, 3, 0, 1, 2, 3] and block["params"] == report["params"]


@pytest.mark.parametrize(
    "args",
    [
        ["--reuse-map", "0,1,1,1", "--layers", "4"],
        ["--reuse-map", "1,1", "--layers", "4"],
        ["--reuse-map", "1.5,1,1,1", "--layers", "4"],
        ["--layers", "abc"],
        ["--block", "0"],
        ["--reuse-map", "1,1,1,1", "--block", "2", "--layers", "4"],
        ["--pe", "sinusoid"],
        ["--space", "nowhere.toml"],
        ["--tokenizer", "wordpiece"],
    ],
)
def test_flops_cli_bad_input(cli, args):
    assert_one_line_error(cli("flops", *args))


@pytest.mark.slow
def test_console_script_bad_input_is_one_error_line(console):
    """The in-process cases above, through the real console entry point: a usage error click reports, and an
    input error ilr-search reports."""
    assert_one_line_error(console("flops", "--layers", "abc"))
    assert_one_line_error(console("flops", "--reuse-map", "0,1,1,1", "--layers", "4"))
