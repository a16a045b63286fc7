"""Compiled training (issue 20): graphs are compiled once per shape, never per map, and change no result.

Real tiny models in fp32. On CPU the compile backend is aot_eager (ILR_SEARCH_COMPILE_BACKEND): it traces
forward and backward through dynamo and AOTAutograd, so the graphs counted are the ones inductor would get, without
inductor's C++ code generation, which takes minutes on this CPU. On a CUDA machine (benchmarks/gpu_check.sh) the
same tests run with torch's default backend, inductor.

Tolerance: compiled fused members' validation losses equal the uncompiled fused ones to 1e-5 absolute (fp32). On
CPU they agree to ~1e-6 with RoPE (the compiled layer rotates with real arithmetic, the eager one with a complex
product) and exactly with the other position encodings."""

from dataclasses import replace

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from ilr_search.config import DataConfig, ModelConfig, TrainConfig
from ilr_search.data.tokens import load_tokens
from ilr_search.training.device import COMPILE_BACKEND_ENV, compile_backend
from ilr_search.training.fused import train_fused
from ilr_search.training.schedule import reuse_map_schedule
from ilr_search.training.train import train_proxy

TOLERANCE = 1e-5
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


@pytest.fixture(scope="module")
def data(token_cache):
    return load_tokens(DataConfig(), root=token_cache)


@pytest.fixture
def fresh_compiles(monkeypatch):
    """Dynamo's caches and counters emptied, and on CPU the aot_eager backend; returns the graph counter."""
    monkeypatch.delenv(COMPILE_BACKEND_ENV, raising=False)
    torch._dynamo.reset()
    counters.clear()

    def setup(device: str):
        if device == "cpu":
            monkeypatch.setenv(COMPILE_BACKEND_ENV, "aot_eager")
        return lambda: counters["stats"]["unique_graphs"]

    yield setup
    torch._dynamo.reset()


def tiny_model(repeat_scale: str = "off") -> ModelConfig:
    return ModelConfig(
        vocab_size=256, n_layers=4, d_model=16, n_heads=2, seq_len=32, pe="rope", repeat_scale=repeat_scale
    )


def tiny_train(device: str, compile_layers: bool) -> TrainConfig:
    return TrainConfig(
        steps=4,
        batch_size=4,
        lr=3e-3,
        eval_fractions=(0.5, 1.0),
        eval_windows=4,
        dtype="fp32",
        device=device,
        checkpoint_every=0,
        compile=compile_layers,
    )


def test_the_compile_backend_is_inductor_unless_the_environment_names_another(monkeypatch):
    monkeypatch.delenv(COMPILE_BACKEND_ENV, raising=False)
    assert compile_backend() == "inductor"
    monkeypatch.setenv(COMPILE_BACKEND_ENV, "aot_eager")
    assert compile_backend() == "aot_eager"


# Two groups of two maps each, all four schedules 5 layer runs long, repeats at different layers (and under
# repeat_scale "residual", at different positions of the schedule).
FIRST_GROUP = [reuse_map_schedule([2, 1, 1, 1]), reuse_map_schedule([1, 1, 2, 1])]
SECOND_GROUP = [reuse_map_schedule([1, 2, 1, 1]), reuse_map_schedule([1, 1, 1, 2])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("repeat_scale", ["off", "residual"])
def test_a_second_fused_group_of_other_maps_compiles_nothing_and_matches_uncompiled(
    data, fresh_compiles, device, repeat_scale
):
    graphs = fresh_compiles(device)
    model_cfg = tiny_model(repeat_scale)
    compiled_cfg, plain_cfg = tiny_train(device, True), tiny_train(device, False)
    first = train_fused(model_cfg, FIRST_GROUP, data, compiled_cfg)
    # The layer and the loss head, each once with gradients (training) and once without (evaluation): with no
    # layer compiled, or a graph break in it, this count differs.
    assert graphs() == 4
    second = train_fused(model_cfg, SECOND_GROUP, data, compiled_cfg)
    assert graphs() == 4  # other maps, a new FusedGroup: every graph reused
    plain = train_fused(model_cfg, FIRST_GROUP + SECOND_GROUP, data, plain_cfg)
    assert graphs() == 4  # uncompiled: nothing traced
    for compiled_result, plain_result in zip(first + second, plain, strict=True):
        assert compiled_result.status == plain_result.status == "ok"
        assert [p.step for p in compiled_result.curve] == [p.step for p in plain_result.curve]
        for a, b in zip(compiled_result.curve, plain_result.curve, strict=True):
            assert a.val_loss == pytest.approx(b.val_loss, abs=TOLERANCE)
    assert first[0].val_loss != first[1].val_loss  # the maps really differ


def test_members_of_five_schedule_lengths_compile_each_running_count_once(data, fresh_compiles):
    """Five members with schedules of 4 to 8 runs: 5, 4, 3, 2 and 1 of them run at the later positions, a shape
    each, with and without gradients: 10 graphs of the layer (more than dynamo's default limit of 8 per
    function, past which it would run the layer uncompiled) and 2 of the head. A later group of other maps with
    the same lengths adds nothing."""
    graphs = fresh_compiles("cpu")
    model_cfg, cfg = tiny_model(), tiny_train("cpu", True)
    first = [[1, 1, 1, 1], [2, 1, 1, 1], [1, 3, 1, 1], [2, 1, 2, 2], [1, 4, 1, 2]]
    second = [[1, 1, 1, 1], [1, 1, 1, 2], [1, 1, 2, 2], [3, 1, 1, 2], [2, 2, 2, 2]]
    train_fused(model_cfg, [reuse_map_schedule(m) for m in first], data, cfg)
    assert graphs() == 2 * 5 + 2
    train_fused(model_cfg, [reuse_map_schedule(m) for m in second], data, cfg)
    assert graphs() == 2 * 5 + 2


def test_train_proxy_compiles_its_layers_once_for_every_map(data, fresh_compiles):
    graphs = fresh_compiles("cpu")
    model_cfg, cfg = tiny_model(), tiny_train("cpu", True)
    first = train_proxy(model_cfg, FIRST_GROUP[0], data, cfg)
    assert graphs() == 4  # the decoder layer and the loss head, with and without gradients
    second = train_proxy(model_cfg, SECOND_GROUP[0], data, cfg)
    assert graphs() == 4  # a new model and another map: the same graphs
    plain = train_proxy(model_cfg, SECOND_GROUP[0], data, replace(cfg, compile=False))
    assert second.val_loss == pytest.approx(plain.val_loss, abs=TOLERANCE)
    assert first.val_loss != second.val_loss


def test_train_proxy_under_repeat_scale_residual_stops_compiling_after_two_repeat_counts(data, fresh_compiles):
    """The single model's branch factor 1 / r is a Python float: dynamo first compiles it as a constant, and at
    the second value of r recompiles it as a symbolic float (automatic dynamic); later maps compile nothing."""
    graphs = fresh_compiles("cpu")
    model_cfg, cfg = tiny_model("residual"), tiny_train("cpu", True)
    train_proxy(model_cfg, reuse_map_schedule([2, 1, 1, 1]), data, cfg)
    train_proxy(model_cfg, reuse_map_schedule([1, 3, 1, 1]), data, cfg)
    after_two = graphs()
    for reuse_map in ([1, 1, 4, 1], [1, 2, 1, 3]):
        train_proxy(model_cfg, reuse_map_schedule(reuse_map), data, cfg)
    assert graphs() == after_two
