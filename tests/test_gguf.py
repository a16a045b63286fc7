"""GGUF files as checkpoints (training/gguf.py): a tiny random Llama that each test module writes itself as a GGUF
file (tests/gguf_files.py, with the gguf package's writer), read by `--init FILE.gguf` into the in-package model with
the logits transformers' own GGUF loader gives; the file's digest in the study; the note a quantized file gets; and
the input refused, each with one error line and nothing written."""

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from conftest import SHORT_CORPUS, assert_one_line_error, frozen_run_args, write_space

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from gguf_files import write_llama_gguf  # noqa: E402

from ilr_search.search.plan import checkpoint_identity  # noqa: E402
from ilr_search.training.pretrained import open_checkpoint  # noqa: E402
from ilr_search.training.train import build_model  # noqa: E402

SEQ = 16
QUANTIZED = {"blk.0.ffn_up.weight": "Q8_0", "blk.1.attn_v.weight": "Q8_0"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{name: (GGUF file, the transformers model written into it)}: F32 tied and untied, and one with two tensors
    in Q8_0. Each in a folder of its own (a folder holding one GGUF file is a source too)."""
    cases = {"tied": {}, "untied": {"tie": False}, "quantized": {"quantized": QUANTIZED, "seed": 3}}
    out = {}
    for name, settings in cases.items():
        file = tmp_path_factory.mktemp(name) / f"tiny-{name}.gguf"
        out[name] = (file, write_llama_gguf(file, **settings))
    return out


def transformers_reading(file: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(file.parent), gguf_file=str(file), dtype=torch.float32, local_files_only=True
    ).eval()


def logits(model, x: torch.Tensor, hf: bool = False) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=x, use_cache=False).logits if hf else model(x)


def tokens(vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", ["tied", "untied", "quantized"])
def test_a_gguf_file_gives_the_model_with_transformers_logits(files, token_cache, name):
    file, written = files[name]
    checkpoint = open_checkpoint(str(file), seq_len=SEQ)
    cfg = checkpoint.config
    assert checkpoint.family == "llama" and cfg.init == str(file)
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.vocab_size) == (2, 64, 4, 2, 300)
    assert cfg.tie_embeddings == (name != "untied")
    assert checkpoint.path.parent == token_cache and checkpoint.path.name.startswith("gguf-")
    assert checkpoint.tokenizer_file == checkpoint.path / "tokenizer.json"
    model = build_model(cfg, seed=123).eval()  # the training path: the file's weights, whatever the seed
    x = tokens(cfg.vocab_size)
    ours = logits(model, x)
    torch.testing.assert_close(ours, logits(transformers_reading(file), x, hf=True), atol=1e-4, rtol=1e-4)
    if name == "quantized":  # the dequantized weights are another model than the one quantized
        assert checkpoint.gguf.quantized_types == ("Q8_0",)
        assert (ours - logits(written, x, hf=True)).abs().max() > 1e-3
    else:
        assert checkpoint.gguf.quantized_types == ()
        torch.testing.assert_close(ours, logits(written, x, hf=True), atol=1e-4, rtol=1e-4)


def test_the_tokenizer_is_the_files(files, token_cache):
    """The data is tokenized by the tokenizer transformers builds from the file's metadata."""
    from tokenizers import Tokenizer

    file, _ = files["tied"]
    checkpoint = open_checkpoint(str(file), seq_len=SEQ)
    ours = Tokenizer.from_file(str(checkpoint.tokenizer_file))
    theirs = transformers.AutoTokenizer.from_pretrained(str(file.parent), gguf_file=str(file), local_files_only=True)
    text = "def add(a, b):\n    return a + b  # the quick brown fox\n"
    assert ours.encode(text).ids == theirs(text)["input_ids"]
    assert len(ours.encode(text).ids) < len(text.encode())  # merges, not bytes


def test_a_folder_holding_one_gguf_file_is_that_file(files, token_cache):
    file, _ = files["tied"]
    by_folder = open_checkpoint(str(file.parent), seq_len=SEQ)
    assert by_folder.path == open_checkpoint(str(file), seq_len=SEQ).path
    assert by_folder.gguf.file == file.resolve() and by_folder.config.init == str(file.parent)


def test_the_study_knows_the_file_by_its_digest(files, token_cache):
    file, _ = files["untied"]
    assert checkpoint_identity(str(file)) == {
        "source": str(file),
        "gguf_sha256": hashlib.sha256(file.read_bytes()).hexdigest(),
    }


def test_flops_json_of_a_gguf_file(cli, files):
    file, _ = files["tied"]
    proc = cli("flops", "--init", str(file), "--reuse-map", "2,1", "--json", check=True)
    report = json.loads(proc.stdout)
    assert report["schedule"] == [0, 0, 1] and report["flops_ratio"] > 1
    assert "note:" not in proc.stderr  # F32 tensors: the original model


def test_a_quantized_file_is_said_to_be_the_quantized_model_once(cli, files):
    file, _ = files["quantized"]
    proc = cli("flops", "--init", str(file), "--json", check=True)
    assert json.loads(proc.stdout)["schedule"] == [0, 1]  # stdout: one JSON object
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note:")]
    assert notes == [
        f"note: {file.name} holds Q8_0 weights, dequantized to float32: this is the quantized model, not the original"
    ], proc.stderr


FROZEN = {
    "noise_seeds": 0,
    "families": ["ilr"],
    "max_reuse": 2,
    "n_trials": 1,
    "race_seeds": 2,
    "max_seeds": 3,
    "enqueue_paper_maps": False,
}


@pytest.mark.slow
def test_a_frozen_study_of_a_gguf_file_refuses_another_file_at_the_same_path(cli, tmp_path, one_usable_core):
    """The study records the file's digest: the same path holding another file is another checkpoint. A
    quantized file's note is said once in the run's output."""
    file = tmp_path / "model.gguf"
    write_llama_gguf(file, seed=5, quantized={"blk.0.ffn_down.weight": "Q8_0"})
    space = write_space(tmp_path / "frozen.toml", search=FROZEN, train={"eval_windows": 4}, data=SHORT_CORPUS)
    args = [
        *frozen_run_args(space, file, "1.5x", f"sqlite:///{tmp_path / 'gguf.db'}"),
        "--study",
        "gguf",
    ]
    proc = cli(*args, "--json", check=True)
    assert sum(line.startswith("note: model.gguf holds Q8_0 weights") for line in proc.stderr.splitlines()) == 1
    assert json.loads(proc.stdout)["study"] == "gguf"
    other = tmp_path / "other.gguf"
    write_llama_gguf(other, seed=6, quantized={"blk.0.ffn_down.weight": "Q8_0"})
    os.replace(other, file)
    proc = cli(*args)
    assert_one_line_error(proc)
    assert "gguf_sha256" in proc.stderr


def refused(cli, tmp_path, init: str, *words: str) -> None:
    """`flops --init INIT` is one error line (with `words` in it), exit 2, and no cache written."""
    cache = tmp_path / "cache"
    proc = cli("flops", "--init", init, "--json", env={"ILR_SEARCH_CACHE": str(cache)})
    assert_one_line_error(proc)
    assert proc.stdout == "" and not cache.exists()
    for word in words:
        assert word in proc.stderr, proc.stderr


def test_an_unsupported_architecture_is_refused_before_anything_is_written(cli, tmp_path):
    file = tmp_path / "gemma.gguf"
    write_llama_gguf(file, architecture="gemma3")
    refused(cli, tmp_path, str(file), "'gemma3' is not supported", "llama, mistral, qwen2, qwen3")


def test_a_missing_gguf_file_is_refused(cli, tmp_path):
    refused(cli, tmp_path, str(tmp_path / "nowhere.gguf"), "no such GGUF file")


def test_a_folder_of_two_gguf_files_is_refused(cli, tmp_path, files):
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / "two").mkdir(exist_ok=True)
        (tmp_path / "two" / name).write_bytes(files["tied"][0].read_bytes())
    refused(cli, tmp_path, str(tmp_path / "two"), "2 GGUF files", "a.gguf, b.gguf")


def test_a_folder_of_no_gguf_file_nor_config_is_refused(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    refused(cli, tmp_path, str(tmp_path / "empty"), "no config.json (nor a .gguf file)")


@pytest.mark.parametrize("content", ["text", "truncated"])
def test_a_corrupt_gguf_file_is_refused(cli, tmp_path, files, content):
    file = tmp_path / "bad.gguf"
    file.write_bytes(b"not a GGUF file\n" * 8 if content == "text" else files["tied"][0].read_bytes()[:5000])
    refused(cli, tmp_path, str(file), "not a readable GGUF file")


def test_without_the_gguf_package_one_line_says_what_to_install(cli, tmp_path, files, monkeypatch):
    file = tmp_path / "m.gguf"
    file.write_bytes(files["tied"][0].read_bytes())
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` fails, as where it is not installed
    refused(cli, tmp_path, str(file), "needs gguf", "pip install 'ilr-search[gguf]'")


@pytest.mark.slow
def test_a_gguf_studys_mergekit_config_names_its_converted_folder_and_mergekit_builds_it(
    cli, tmp_path, files, one_usable_core
):
    """mergekit reads no GGUF: the config of a GGUF study takes its slices from the transformers folder the file was
    converted into, and the model mergekit builds from it gives the unrolled map's logits."""
    import yaml
    from mergekit.config import MergeConfiguration
    from mergekit.merge import run_merge
    from mergekit.options import MergeOptions

    file, _ = files["tied"]
    space = write_space(
        tmp_path / "frozen.toml",
        search={**FROZEN, "families": ["ilr", "blocks"]},
        train={"eval_windows": 4},
        data=SHORT_CORPUS,
    )
    db = f"sqlite:///{tmp_path / 'gguf.db'}"
    cli(
        *frozen_run_args(space, file, "1.5x", db),
        "--study",
        "g",
        "--enqueue",
        "block:0-1:2",
        check=True,
    )
    out = tmp_path / "block.yml"
    cli(
        "export-model",
        "--study",
        "g",
        "--storage",
        db,
        "--map",
        "block:0-1:2",
        "--format",
        "mergekit",
        "--out",
        str(out),
        check=True,
    )
    config = yaml.safe_load(out.read_text(encoding="utf-8"))
    folder = Path(config["slices"][0]["sources"][0]["model"])
    assert folder.is_dir() and (folder / "config.json").is_file() and folder.name.startswith("gguf-")
    merged = tmp_path / "merged"
    run_merge(
        MergeConfiguration.model_validate(config),
        str(merged),
        MergeOptions(copy_tokenizer=True, quiet=True, write_model_card=False),
    )
    hf = transformers.AutoModelForCausalLM.from_pretrained(merged).eval()
    cfg = open_checkpoint(str(file), seq_len=SEQ).config
    x = tokens(cfg.vocab_size)
    with torch.no_grad():
        unrolled = build_model(cfg, 0).eval()(x, [0, 1, 0, 1])  # block:0-1:2 on the file's 2 layers
    torch.testing.assert_close(logits(hf, x, hf=True), unrolled, atol=1e-4, rtol=1e-4)
