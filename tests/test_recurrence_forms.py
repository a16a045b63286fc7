"""Recurrence beyond whole layers: a layer's attention or MLP repeated alone (`3a`, `2m`, `block:I-J:Ra`) and
per-pass low-rank adapters (`adapters=RANK`), in the one map grammar. The text round-trips; the forward pass runs the
branches the text says (checked against a hand-unrolled pass); FLOPs equal torch's FlopCounterMode for every part,
positional encoding and knob; adapters at B = 0 are the plain repeat exactly; the exports equal the model; a frozen
search of a checkpoint trained with `1,3a,1,1` claims that map, not the whole-layer `1,3,1,1`; an A/A judge of
one-branch candidates claims nothing; bad input is one error line."""

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from conftest import assert_one_line_error, frozen_run_args, write_space

from ilr_search.config import DataConfig, ModelConfig, TrainConfig
from ilr_search.training.flops import count_flops, forward_flops_per_token, map_param_count, param_count
from ilr_search.training.model import ILRTransformer, decoder_layer, position_tables
from ilr_search.training.schedule import Map, ScheduleError


def tiny(**kw) -> ModelConfig:
    return ModelConfig(
        **{"vocab_size": 64, "n_layers": 4, "d_model": 32, "n_heads": 4, "seq_len": 16, "max_reuse": 4} | kw
    )


@pytest.mark.parametrize(
    "text, counts, parts, schedule",
    [
        ("1,3a,1,2m", (1, 3, 1, 2), ("", "a", "", "m"), [0, 1, 1, 1, 2, 3, 3]),
        ("2,2,1,1", (2, 2, 1, 1), (), [0, 0, 1, 1, 2, 3]),
        ("plain", (1, 1, 1, 1), (), [0, 1, 2, 3]),
    ],
)
def test_a_reuse_map_with_parts_round_trips(text, counts, parts, schedule):
    chosen = Map.parse(text, 4)
    assert chosen.form == "layers" and (chosen.counts, chosen.parts, chosen.schedule()) == (
        counts,
        parts,
        schedule,
    )
    assert Map.parse(str(chosen), 4) == chosen


def test_one_plain_layer_has_one_map_and_one_key():
    assert Map.parse("1a,1m,1,1", 4) == Map.parse("1,1,1,1", 4) == Map.baseline(4)
    assert str(Map.parse("1a,2,1m,1", 4)) == "1,2,1,1"


def test_a_block_takes_a_part_and_a_one_layer_block_is_its_reuse_map():
    block = Map.parse("block:1-2:3a", 4)
    assert block.is_block and str(block) == "block:1-2:3a" and block.parts == ("", "a", "a", "")
    assert block.schedule() == [0, 1, 2, 1, 2, 1, 2, 3]
    assert Map.parse("block:2-2:3m", 4) == Map.parse("1,1,3m,1", 4)
    assert Map.parse("block:1-2:1a", 4) == Map.baseline(4)  # a block run once is the plain model


@pytest.mark.parametrize("text", ["3x,1,1,1", "0a,1,1,1", "2b,1,1,1", "a,1,1,1", "block:1-2:2x", "1,1,1"])
def test_bad_map_text_is_refused(text):
    with pytest.raises(ScheduleError):
        Map.parse(text, 4)


def unrolled(model: ILRTransformer, x: torch.Tensor, passes: list[tuple[int, tuple[float, float] | None]]):
    """The final hidden states of `model` run pass by pass as written here: (layer, (attention factor, MLP
    factor)), 0 for a branch that does not run."""
    tables = position_tables(model.cfg, x.shape[1], x.device)
    h = model.embed(x)
    for layer, scale in passes:
        h = decoder_layer(h[None], model.layers[layer].weights(), *tables, scale, 4, 4, model.cfg.norm_eps)[0]
    return model.norm(h)


@pytest.mark.parametrize(
    "text, passes",
    [
        ("1,3a,1,2m", [(0, None), (1, (1.0, 0.0)), (1, (1.0, 0.0)), (1, None), (2, None), (3, None), (3, (0.0, 1.0))]),
        ("block:1-2:2a", [(0, None), (1, (1.0, 0.0)), (2, (1.0, 0.0)), (1, None), (2, None), (3, None)]),
        (
            "block:0-1:3m",
            [
                (0, None),
                (1, None),
                (0, (0.0, 1.0)),
                (1, (0.0, 1.0)),
                (0, (0.0, 1.0)),
                (1, (0.0, 1.0)),
                (2, None),
                (3, None),
            ],
        ),
    ],
)
def test_one_branch_passes_run_the_branches_the_text_says(text, passes):
    chosen = Map.parse(text, 4)
    model = ILRTransformer(chosen.configure(tiny())).eval()
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model.hidden(x, chosen.schedule()), unrolled(model, x, passes))
        whole = ILRTransformer(tiny()).eval()
        whole.load_state_dict(model.state_dict())
        assert not torch.equal(whole.hidden(x, chosen.schedule()), model.hidden(x, chosen.schedule()))


KNOBS = [{}, {"adapter_rank": 4}, {"damping": 0.5}, {"injection": "add", "iteration_norms": True}]


@pytest.mark.parametrize("pe", ["rope", "nope", "learned", "alibi"])
@pytest.mark.parametrize("knobs", KNOBS, ids=["off", "adapters", "damping", "injection-norms"])
def test_analytic_flops_equal_the_flop_counter_for_every_part(pe, knobs):
    for text in ("1,3a,1,2m", "2m,1,1,3a", "block:1-2:3a", "block:0-2:2m", "2,2,1,1", "1,1,1,1"):
        chosen = Map.parse(text, 4)
        cfg = chosen.configure(tiny(pe=pe, **knobs))
        model = ILRTransformer(cfg).eval()
        x = torch.randint(0, 64, (1, 16))
        counted = count_flops(lambda i, m=model, c=chosen: m(i, c.schedule()), x) / 16
        assert counted == pytest.approx(forward_flops_per_token(cfg, chosen.schedule()), rel=1e-9), text
        assert model.num_params() == param_count(cfg)


def test_a_one_branch_pass_costs_its_branch_and_adapters_count_their_matmuls_and_parameters():
    from ilr_search.training.flops import branch_flops_per_token

    plain = forward_flops_per_token(tiny(), [0, 1, 2, 3])
    attn, mlp = branch_flops_per_token(tiny())
    two_a = Map.parse("2a,1,1,1", 4)
    assert forward_flops_per_token(two_a.configure(tiny()), two_a.schedule()) == plain + attn
    two_m = Map.parse("2m,1,1,1", 4)
    assert forward_flops_per_token(two_m.configure(tiny()), two_m.schedule()) == plain + mlp
    ranked = dataclasses.replace(two_a.configure(tiny()), adapter_rank=4)
    d, q3, f = 32, 3 * 32, 128
    adapter = 2 * 4 * ((d + q3) + (d + d))  # qkv and the output projection, A then B
    assert forward_flops_per_token(ranked, two_a.schedule()) == plain + attn + adapter
    # the map uses one pass's attention adapters; the model holds max_reuse - 1 passes' for every layer
    assert map_param_count(ranked, two_a.schedule()) == param_count(tiny()) + 4 * ((d + q3) + (d + d))
    assert param_count(ranked) == param_count(tiny()) + 4 * 3 * 4 * ((d + q3) + (d + d) + (d + 2 * f) + (f + d))


def test_adapters_at_zero_equal_the_plain_repeat_exactly_and_move_it_once_trained():
    chosen = Map.parse("1,3a,1,2m", 4)
    torch.manual_seed(3)
    adapted = ILRTransformer(dataclasses.replace(chosen.configure(tiny()), adapter_rank=4)).eval()
    torch.manual_seed(3)
    plain = ILRTransformer(chosen.configure(tiny())).eval()  # the same seed draws the same base weights
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(adapted.hidden(x, chosen.schedule()), plain.hidden(x, chosen.schedule()))
        for name, p in adapted.named_parameters():
            if name.endswith("_b"):
                p.normal_(std=0.05)
        assert not torch.equal(adapted.hidden(x, chosen.schedule()), plain.hidden(x, chosen.schedule()))
        # the plain schedule runs no pass k >= 1: adapters never act on it
        assert torch.equal(adapted.hidden(x, [0, 1, 2, 3]), plain.hidden(x, [0, 1, 2, 3]))


@pytest.mark.parametrize("text", ["1,3a,1,2m", "block:1-2:2a", "2m,2,1,1"])
def test_the_hf_export_equals_the_model_with_parts_and_merged_adapters(text):
    pytest.importorskip("transformers")
    from ilr_search.training.pretrained import unrolled_hf_model

    chosen = Map.parse(text, 4)
    cfg = dataclasses.replace(chosen.configure(tiny(max_reuse=3)), adapter_rank=4, damping=0.5)
    torch.manual_seed(0)
    model = ILRTransformer(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_b"):
                p.normal_(std=0.05)
        x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(2))
        ours = model(x, chosen.schedule())
        theirs = unrolled_hf_model(model, chosen.schedule(), "llama")(x).logits
    assert (ours - theirs).abs().max().item() < 1e-4


def test_fused_members_with_parts_equal_their_single_runs(token_cache):
    from ilr_search.data.tokens import load_tokens
    from ilr_search.training.fused import train_fused
    from ilr_search.training.train import train_proxy

    data = load_tokens(DataConfig(), root=token_cache)
    cfg = ModelConfig(vocab_size=256, n_layers=3, d_model=16, n_heads=2, seq_len=32, parts=("a", "", "m"))
    train = TrainConfig(steps=12, batch_size=4, lr=3e-3, eval_fractions=(0.5, 1.0), eval_windows=8, device="cpu")
    schedules = [[0, 0, 0, 1, 2, 2], [0, 1, 2], [0, 0, 1, 2, 2, 2]]  # 3a,1,2m; plain; 2a,1,3m
    fused = train_fused(cfg, schedules, data, train, seeds=[0, 1, 0])
    for schedule, seed, result in zip(schedules, [0, 1, 0], fused, strict=True):
        single = train_proxy(cfg, schedule, data, dataclasses.replace(train, seed=seed))
        for a, b in zip(result.curve, single.curve, strict=True):
            assert a.val_loss == pytest.approx(b.val_loss, abs=1e-4)


def test_adapters_are_refused_by_the_fused_trainer_in_its_one_place():
    from ilr_search.training.fused import FusionUnsupported, check_fusable

    with pytest.raises(FusionUnsupported, match="adapters"):
        check_fusable(tiny(adapter_rank=4))


BAD_REQUESTS = {  # name: (arguments after the command, a phrase of the error line)
    "an entry that is no count": (["flops", "--layers", "4", "--reuse-map", "3x,1,1,1"], "each R"),
    "a part on a count below one": (["flops", "--layers", "4", "--reuse-map", "0a,1,1,1"], "count below 1"),
    "a rank above d_model": (
        ["flops", "--layers", "4", "--d-model", "32", "--reuse-map", "2,1,1,1", "--knobs", "adapters=64"],
        "adapter_rank",
    ),
    "an unknown part": (["run", "--layers", "4", "--budget", "1.5x", "--parts", "both,ffn"], "parts"),
    "a part on block recurrence, which has none": (
        ["run", "--layers", "4", "--budget", "2x", "--parts", "both,attn", "--enqueue", "block2a"],
        "has no part",
    ),
    "a part the study does not search": (
        ["run", "--layers", "4", "--budget", "1.5x", "--enqueue", "1,2a,1,1"],
        "not searched",
    ),
}


@pytest.mark.parametrize("case", BAD_REQUESTS)
def test_bad_recurrence_forms_are_one_error_line_and_write_nothing(case, cli, tmp_path):
    args, phrase = BAD_REQUESTS[case]
    db = tmp_path / "studies.db"
    extra = ["--storage", f"sqlite:///{db}"] if args[0] == "run" else []
    proc = cli(*args, *extra)
    assert_one_line_error(proc)
    assert phrase in proc.stderr, proc.stderr
    assert not db.exists()


TRAINED_PARTS_MAP = "1,3a,1,1"


@pytest.fixture(scope="module")
def parts_checkpoint(tmp_path_factory, token_cache) -> Path:
    """The in-package model (4 layers, d_model 32, byte tokens) trained with 1,3a,1,1 (layer 1's attention three
    times, then its MLP once) on the embedded corpus, its four distinct layers written as a plain 4-layer Llama."""
    from ilr_search.data.tokens import load_tokens
    from ilr_search.training.pretrained import export_checkpoint
    from ilr_search.training.train import train_proxy

    chosen = Map.parse(TRAINED_PARTS_MAP, 4)
    cfg = chosen.configure(ModelConfig(vocab_size=256, n_layers=4, d_model=32, n_heads=2, seq_len=64))
    trained: list[ILRTransformer] = []
    train = TrainConfig(steps=300, batch_size=8, lr=1e-2, eval_fractions=(1.0,), eval_windows=16, device="cpu")
    result = train_proxy(
        cfg, chosen.schedule(), load_tokens(DataConfig(), seq_len=64), train, on_trained=trained.append
    )
    assert result.status == "ok", result.reason
    return export_checkpoint(trained[0], [0, 1, 2, 3], tmp_path_factory.mktemp("parts") / "tiny-llama-3a")


@pytest.mark.slow
def test_a_frozen_search_claims_the_sub_module_map_a_checkpoint_was_trained_with(
    cli, tmp_path, parts_checkpoint, one_usable_core
):
    search = {
        "noise_seeds": 0,
        "families": ["ilr"],
        "max_reuse": 3,
        "n_trials": 4,
        "race_seeds": 3,
        "max_seeds": 6,
        "race_contenders": 3,
        "enqueue_paper_maps": False,
        "parts": ["both", "attn", "mlp"],
    }
    # the first ~2 MB of the embedded corpus (its held-out part ~70,000 tokens: room for 6 chunks of 16 windows and
    # more): the checkpoint's own tokenizer.json tokenizes what the study reads anew, about 10 CPU-seconds whole
    space = write_space(
        tmp_path / "parts.toml", search=search, train={"eval_windows": 16}, data={"max_train_tokens": 500_000}
    )
    proc = cli(
        *frozen_run_args(space, parts_checkpoint, "1.5x", f"sqlite:///{tmp_path / 'parts.db'}"),
        "--enqueue",
        f"{TRAINED_PARTS_MAP} 1,3,1,1 1,1,3m,1",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["answer"].startswith(f"use {TRAINED_PARTS_MAP}:"), summary["answer"]
    results = {(r["map_key"], r["seed"]): r["val_loss"] for r in summary["race"]["results"]}
    by_map = {c["map"]: c for c in summary["race"]["comparisons"]}
    assert by_map[TRAINED_PARTS_MAP]["status"] == "better", by_map
    # the whole-layer map of the same counts is not claimed, and on the held-out chunks both ran it is worse
    assert by_map.get("1,3,1,1", {}).get("status") != "better", by_map
    shared = [s for s in by_map[TRAINED_PARTS_MAP]["seeds"] if ("1,3,1,1", s) in results]
    assert shared, results

    def mean_loss(key: str) -> float:
        return math.fsum(results[(key, s)] for s in shared) / len(shared)

    assert mean_loss(TRAINED_PARTS_MAP) < mean_loss("1,3,1,1")
    # the search proposed parts: its trials carry one part per layer beside the counts
    trials = json.loads(cli("trials", "--storage", f"sqlite:///{tmp_path / 'parts.db'}", "--json", check=True).stdout)[
        "trials"
    ]
    assert any("a" in (t["map"] or "") for t in trials), trials


@pytest.mark.slow
def test_an_a_a_judge_of_one_branch_candidates_claims_nothing(cli, tmp_path, recurrent_checkpoint, one_usable_core):
    """A one-branch pass damped to 1e-7 adds nothing but float rounding: `1,2a,1,1|damping=1e-7` runs layer 1's
    attention, a 1e-7 copy of it, then its MLP; `1,1,2m,1|damping=1e-7` layer 2 whole, then a 1e-7 MLP. Each is the
    model itself, so the judge must claim neither better nor worse, however many windows it pairs."""
    space = write_space(tmp_path / "judge.toml", train={"eval_windows": 8})
    proc = cli(
        "judge",
        "--space",
        str(space),
        "--init",
        str(recurrent_checkpoint),
        "--storage",
        f"sqlite:///{tmp_path / 'aa.db'}",
        "--chunks",
        "8",
        "--candidate",
        "1,2a,1,1|damping=1e-7",
        "--candidate",
        "1,1,2m,1|damping=1e-7",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    comparisons = json.loads(proc.stdout)["race"]["comparisons"]
    assert {c["map"] for c in comparisons} == {"1,2a,1,1|damping=1e-07", "1,1,2m,1|damping=1e-07"}
    for c in comparisons:
        assert c["status"] not in ("better", "worse") and abs(c["mean_diff"]) < 1e-4, c


@pytest.mark.parametrize("retrofit", ["adapters", "all"])
def test_a_retrofit_with_adapters_trains_the_adapters_alone_unless_told_to_train_all(
    recurrent_checkpoint, token_cache, retrofit
):
    from ilr_search.data.tokens import load_tokens
    from ilr_search.training.build import build_model
    from ilr_search.training.pretrained import open_checkpoint
    from ilr_search.training.train import train_proxy

    cfg = dataclasses.replace(
        open_checkpoint(str(recurrent_checkpoint), seq_len=64).config, adapter_rank=4, max_reuse=2
    )
    data = load_tokens(DataConfig(tokenizer=f"file:{recurrent_checkpoint / 'tokenizer.json'}"), seq_len=64)
    train = TrainConfig(
        steps=3, batch_size=4, lr=1e-2, eval_fractions=(1.0,), eval_windows=8, device="cpu", checkpoint_every=0
    )
    trained: list[ILRTransformer] = []
    result = train_proxy(
        cfg, [0, 0, 1, 1, 2, 3], data, dataclasses.replace(train, retrofit=retrofit), on_trained=trained.append
    )
    assert result.status == "ok", result.reason
    before = build_model(cfg, seed=0).state_dict()
    moved = {name for name, t in trained[0].state_dict().items() if not torch.equal(t, before[name])}
    adapters = {name for name in moved if ".adapters." in name}
    assert {n for n in adapters if n.endswith("_b")} and adapters <= moved  # the adapters of the repeated passes train
    assert (moved == adapters) is (retrofit == "adapters"), sorted(moved - adapters)[:3]
