"""The bridge to transformers' checkpoints (training/pretrained.py): real Llama, Mistral, Qwen2 and Qwen3 models
that each test builds from a tiny config with random weights and saves itself, read into the in-package model
with the same logits, and the in-package model written back (its schedule unrolled) and read by transformers."""

import dataclasses
import json
import os

import pytest
import torch

from ilr_search.config import ModelConfig
from ilr_search.data.tokenizers import byte_tokenizer_model
from ilr_search.training.model import ILRTransformer
from ilr_search.training.pretrained import SUPPORTED_FAMILIES, CheckpointError, export_checkpoint, open_checkpoint
from ilr_search.training.train import build_model

transformers = pytest.importorskip("transformers")

SEQ = 16
COMMON = {
    "vocab_size": 300,
    "hidden_size": 32,
    "intermediate_size": 80,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 5000.0,
}
# name: (family, the config's own settings, the ModelConfig fields it must give)
CASES = {
    "llama": ("llama", {"tie_word_embeddings": True}, {"tie_embeddings": True}),
    "llama-untied": ("llama", {"tie_word_embeddings": False}, {"tie_embeddings": False}),
    "llama-gqa": ("llama", {"num_key_value_heads": 1, "tie_word_embeddings": True}, {"n_kv_heads": 1}),
    "mistral": ("mistral", {"num_key_value_heads": 2, "sliding_window": None}, {"n_kv_heads": 2}),
    "qwen2": ("qwen2", {"num_key_value_heads": 2, "tie_word_embeddings": True}, {"qkv_bias": True}),
    "qwen3": (
        "qwen3",
        {"num_key_value_heads": 2, "head_dim": 12, "tie_word_embeddings": False},
        {"qk_norm": True, "head_dim": 12, "n_kv_heads": 2},
    ),
}
CONFIG_CLASSES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config"}


def save_hf_model(folder, family: str, settings: dict, seed: int = 0):
    """A transformers model of a tiny config, every weight random (norm gains and biases too), saved with a
    byte tokenizer as save_pretrained writes it; the model, in eval mode."""
    config = getattr(transformers, CONFIG_CLASSES[family])(**COMMON, **settings)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    byte_tokenizer_model().save(str(folder / "tokenizer.json"))
    return model


def hf_logits(model, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=x, use_cache=False).logits


def tokens(vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each case's transformers model, saved once for the module: {name: (folder, model)}."""
    out = {}
    for name, (family, settings, _) in CASES.items():
        folder = tmp_path_factory.mktemp(name)
        out[name] = (folder, save_hf_model(folder, family, settings))
    return out


@pytest.mark.parametrize("name", CASES)
def test_a_checkpoint_gives_the_model_with_transformers_logits(saved, name):
    folder, hf_model = saved[name]
    family, _, expected = CASES[name]
    checkpoint = open_checkpoint(str(folder), seq_len=SEQ)
    assert checkpoint.family == family and checkpoint.tokenizer_file == folder / "tokenizer.json"
    cfg = checkpoint.config
    assert (cfg.vocab_size, cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.seq_len) == (300, 2, 32, 4, SEQ)
    assert (cfg.mlp_hidden, cfg.norm_eps, cfg.rope_base, cfg.init, cfg.pe) == (80, 1e-5, 5000.0, str(folder), "rope")
    for field, value in expected.items():
        assert getattr(cfg, field) == value, field
    model = build_model(cfg, seed=123).eval()  # the training path: the checkpoint's weights, whatever the seed
    x = tokens(cfg.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf_logits(hf_model, x), atol=1e-4, rtol=1e-4)


def test_seq_len_defaults_to_the_checkpoints_positions_up_to_2048(saved):
    assert open_checkpoint(str(saved["llama"][0])).config.seq_len == 64


def test_a_reuse_map_equals_its_unrolled_export(saved, tmp_path):
    """The qwen3 model (q/k norms, GQA, explicit head_dim, untied) running [0, 0, 1] equals the exported
    three-layer qwen3 checkpoint that transformers loads."""
    folder, _ = saved["qwen3"]
    checkpoint = open_checkpoint(str(folder), seq_len=SEQ)
    model = build_model(checkpoint.config, seed=0).eval()
    out = export_checkpoint(model, [0, 0, 1], tmp_path / "out", family=checkpoint.family, tokenizer_dir_or_file=folder)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf_model).__name__ == "Qwen3ForCausalLM" and hf_model.config.num_hidden_layers == 3
    x = tokens(checkpoint.config.vocab_size, seed=2)
    with torch.no_grad():
        torch.testing.assert_close(model(x, [0, 0, 1]), hf_logits(hf_model, x), atol=1e-4, rtol=1e-4)
        assert not torch.allclose(model(x, [0, 0, 1]), model(x), atol=1e-3)
    assert (out / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """An in-package model (the defaults' architecture, random init, byte vocabulary) written with map 2,1."""
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, seq_len=SEQ)
    model = build_model(cfg, seed=5).eval()
    out = export_checkpoint(model, [0, 0, 1], tmp_path_factory.mktemp("export") / "model")
    return model, out


def test_an_exported_model_loads_in_transformers_with_the_same_logits(exported):
    model, out = exported
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf_model).__name__ == "LlamaForCausalLM" and hf_model.config.num_hidden_layers == 3
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".safetensors") == ["model.safetensors"]
    x = tokens(256, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(model(x, [0, 0, 1]), hf_logits(hf_model, x), atol=1e-4, rtol=1e-4)
    generated = hf_model.generate(x[:1, :4], max_new_tokens=5, do_sample=False)
    assert generated.shape == (1, 9)


def test_an_exported_model_has_the_byte_tokenizer(exported):
    _, out = exported
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer("hello")["input_ids"] == list(b"hello")
    assert tokenizer("héllo ✓")["input_ids"] == list("héllo ✓".encode())
    assert tokenizer.decode(list("héllo ✓".encode())) == "héllo ✓"


def test_an_exported_model_reads_back_as_a_checkpoint(exported):
    """The unrolled export is itself a checkpoint the bridge reads: three plain layers, the same logits."""
    model, out = exported
    checkpoint = open_checkpoint(str(out), seq_len=SEQ)
    assert checkpoint.family == "llama" and checkpoint.config.n_layers == 3
    reread = build_model(checkpoint.config, seed=0).eval()
    x = tokens(256, seed=4)
    with torch.no_grad():
        torch.testing.assert_close(reread(x), model(x, [0, 0, 1]), atol=1e-5, rtol=1e-5)


def test_a_model_with_recurrence_knobs_starts_from_the_checkpoint(saved):
    """The knobs' parameters, which no checkpoint has, start at the plain model (a gated injection of 0)."""
    folder, hf_model = saved["llama"]
    cfg = dataclasses.replace(open_checkpoint(str(folder), seq_len=SEQ).config, injection="gated", init_depth=7)
    x = tokens(cfg.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(build_model(cfg, 0).eval()(x), hf_logits(hf_model, x), atol=1e-4, rtol=1e-4)


def test_a_model_unlike_its_checkpoint_is_refused(saved):
    cfg = dataclasses.replace(open_checkpoint(str(saved["llama"][0]), seq_len=SEQ).config, n_layers=3)
    with pytest.raises(CheckpointError, match="n_layers 3") as e:
        build_model(cfg, 0)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "change,words",
    [
        ({"injection": "add"}, "injection"),
        ({"iteration_encoding": True, "max_reuse": 2}, "iteration_encoding"),
        ({"pe": "nope"}, "rope"),
        ({"qkv_bias": True}, "qwen2"),
    ],
)
def test_export_refuses_what_transformers_cannot_run(tmp_path, change, words):
    model = ILRTransformer(ModelConfig(n_layers=2, d_model=32, n_heads=4, seq_len=SEQ, **change))
    with pytest.raises(CheckpointError, match=words) as e:
        export_checkpoint(model, [0, 1], tmp_path / "out")
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "knobs", [{"damping": 0.5}, {"damping": 0.25, "repeat_scale": "residual"}, {"repeat_scale": "residual"}]
)
def test_damped_repeats_export_as_scaled_o_proj_and_down_proj_copies(tmp_path, knobs):
    """Damping (and repeat_scale residual) are branch factors: the unrolled copies' o_proj and down_proj carry them,
    so a standard checkpoint with no custom code gives the model's logits; the first pass of each layer is unscaled."""
    cfg = ModelConfig(n_layers=3, d_model=32, n_heads=4, seq_len=SEQ, **knobs)
    model = build_model(cfg, seed=7).eval()
    schedule = [0, 1, 2, 1, 2, 1, 2]  # block:1-2:3
    out = export_checkpoint(model, schedule, tmp_path / "damped")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    x = tokens(256, seed=6)
    with torch.no_grad():
        torch.testing.assert_close(model(x, schedule), hf_logits(hf_model, x), atol=1e-4, rtol=1e-4)
    weights = hf_model.state_dict()
    layer1 = model.layers[1].attn.proj.weight.detach()
    assert torch.equal(
        weights["model.layers.1.self_attn.o_proj.weight"], layer1 * (1 / 3 if "repeat_scale" in knobs else 1)
    )
    if "repeat_scale" not in knobs:
        assert torch.allclose(weights["model.layers.3.self_attn.o_proj.weight"], layer1 * knobs["damping"])


def test_a_model_with_q_k_norms_exports_only_as_qwen3(tmp_path):
    model = ILRTransformer(ModelConfig(n_layers=2, d_model=32, n_heads=4, seq_len=SEQ, qk_norm=True))
    with pytest.raises(CheckpointError, match="qwen3"):
        export_checkpoint(model, [0, 1], tmp_path / "out", family="llama")


def write_config(folder, **config):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def weightless(folder, **changes):
    """A folder with a llama config.json (plus `changes`) and an empty model.safetensors name."""
    write_config(folder, **{"model_type": "llama", **COMMON, **changes})
    (folder / "model.safetensors").write_bytes(b"")
    return folder


@pytest.mark.parametrize(
    "make,words",
    [
        (lambda p: p / "nowhere", "no such folder"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "no config.json"),
        (lambda p: write_config(p / "gpt2", model_type="gpt2", n_embd=32), "model_type 'gpt2' is not supported"),
        (lambda p: write_config(p / "mixtral", model_type="mixtral", **COMMON), "model_type 'mixtral'"),
        (lambda p: write_config(p / "moe", model_type="qwen3_moe", **COMMON), "model_type 'qwen3_moe'"),
        (lambda p: write_config(p / "noweights", model_type="llama", **COMMON), "no weights"),
        (
            lambda p: weightless(p / "scaled", rope_scaling={"rope_type": "llama3", "factor": 8.0}),
            "rope scaling 'llama3'",
        ),
        (lambda p: weightless(p / "scaled5", rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}), "'yarn'"),
        (lambda p: weightless(p / "gelu", hidden_act="gelu"), "hidden_act 'gelu'"),
        (lambda p: weightless(p / "mlpbias", mlp_bias=True), "mlp_bias"),
        (lambda p: weightless(p / "obias", attention_bias=True), "attention_bias"),
        (lambda p: weightless(p / "window", model_type="mistral", sliding_window=8), "sliding_window 8"),
    ],
)
def test_bad_checkpoints_are_one_line_errors(tmp_path, make, words):
    folder = make(tmp_path)
    with pytest.raises(CheckpointError, match=words) as e:
        open_checkpoint(str(folder), seq_len=SEQ)
    assert "\n" not in str(e.value)
    if "not supported" in str(e.value) and "model_type" in str(e.value):
        assert all(family in str(e.value) for family in SUPPORTED_FAMILIES)


def test_a_hub_name_offline_is_one_line_error(monkeypatch):
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # tests never download (conftest)
    with pytest.raises(CheckpointError, match=r"cannot fetch hf:some/name: .*\(offline\?\); download it first") as e:
        open_checkpoint("hf:some/name")
    assert "\n" not in str(e.value)


def test_architecture_options_fuse_and_a_checkpoints_weights_train_one_map_at_a_time():
    """The fused trainer runs model.py's forward pass: a model with an architecture option fuses; one that starts
    from a checkpoint (`init`) trains alone."""
    from ilr_search.config import TrainConfig
    from ilr_search.training.fused import FusionUnsupported, check_fusable
    from ilr_search.training.jobs import Job, groups

    base = ModelConfig(n_layers=2, d_model=32, n_heads=4, seq_len=SEQ)
    for change in (
        {"n_kv_heads": 2},
        {"head_dim": 4},
        {"tie_embeddings": False},
        {"qkv_bias": True},
        {"qk_norm": True},
    ):
        cfg = dataclasses.replace(base, **change)
        check_fusable(cfg)
        assert groups([Job(cfg, [0, 1], TrainConfig(seed=s)) for s in range(3)], fuse=4) == [[0, 1, 2]]
    cfg = dataclasses.replace(base, init="somewhere")
    with pytest.raises(FusionUnsupported, match="init"):
        check_fusable(cfg)
    assert groups([Job(cfg, [0, 1], TrainConfig(seed=s)) for s in range(3)], fuse=4) == [[0], [1], [2]]


def test_flops_and_train_start_from_a_checkpoint(saved, cli, tmp_path):
    """--init: the checkpoint's architecture (the space's seq_len kept), its weights, its tokenizer on the data
    (a small text: the tokenizers library takes seconds over the embedded corpus)."""
    from ilr_search.training.flops import param_count

    folder = str(saved["llama-gqa"][0])
    text = tmp_path / "small.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(400)))
    report = json.loads(
        cli("flops", "--init", folder, "--reuse-map", "2,1", "--seq-len", "32", "--json", check=True).stdout
    )
    assert report["schedule"] == [0, 0, 1]
    assert report["params"] == param_count(open_checkpoint(folder, seq_len=32).config)
    trained = json.loads(
        cli(
            "train",
            "--init",
            folder,
            "--reuse-map",
            "2,1",
            "--seq-len",
            "32",
            "--steps",
            "2",
            "--batch-size",
            "2",
            "--data",
            str(text),
            "--json",
            check=True,
        ).stdout
    )
    assert trained["params"] == report["params"] and trained["status"] == "ok"


@pytest.mark.parametrize("args", [["--layers", "4"], ["--d-model", "64"], ["--tokenizer", "byte"], ["--pe", "nope"]])
def test_init_refuses_the_shape_flags(saved, cli, args):
    from conftest import assert_one_line_error

    folder = str(saved["llama"][0])
    assert_one_line_error(cli("flops", "--init", folder, *args))
    assert_one_line_error(cli("train", "--init", folder, *args))


def test_init_of_a_bad_checkpoint_is_one_error_line(cli, tmp_path):
    from conftest import assert_one_line_error

    assert_one_line_error(cli("flops", "--init", str(tmp_path / "nowhere")))
    assert_one_line_error(cli("train", "--init", "hf:some/name", "--steps", "2"))
    assert_one_line_error(cli("flops", "--tokenizer", f"file:{tmp_path / 'none.json'}"))


def test_a_sharded_checkpoint_reads_as_one(saved, tmp_path):
    _, hf_model = saved["qwen2"]
    hf_model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and not (tmp_path / "model.safetensors").exists()
    model = build_model(open_checkpoint(str(tmp_path), seq_len=SEQ).config, seed=0).eval()
    x = tokens(300)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf_logits(hf_model, x), atol=1e-4, rtol=1e-4)


def test_a_map_longer_than_the_checkpoint_is_one_error_line(saved, cli, tmp_path):
    """The checkpoint has 2 layers: a map of 3 counts, or a block past its last layer, is refused before anything
    is written."""
    from conftest import assert_one_line_error

    folder = str(saved["llama"][0])
    for reuse_map in ("2,1,1", "block:1-2:2"):
        for command in ("flops", "train"):
            finished = cli(command, "--init", folder, "--reuse-map", reuse_map, "--seq-len", "32", cwd=tmp_path)
            assert_one_line_error(finished)
    assert not any(tmp_path.iterdir())
