import json
import math
from dataclasses import replace

import numpy as np
import pytest
from conftest import assert_one_line_error

from ilr_search.config import DataConfig, ModelConfig, TrainConfig
from ilr_search.data.tokens import load_tokens
from ilr_search.training.schedule import reuse_map_schedule
from ilr_search.training.train import train_proxy

TINY = ["--layers", "2", "--d-model", "32", "--heads", "2", "--seq-len", "64", "--batch-size", "8", "--dtype", "fp32"]
TRAIN_KEYS = {
    "reuse_map",
    "params",
    "flops_ratio",
    "steps",
    "tokens",
    "val_loss",
    "val_ppl",
    "val_bpb",
    "train_seconds",
    "tokens_per_second",
    "status",
    "curve",
}


@pytest.fixture(scope="module")
def stdlib_tokens(token_cache):
    return load_tokens(DataConfig(), root=token_cache)


def tiny_model(vocab=256) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, n_layers=2, d_model=32, n_heads=2, seq_len=64)


def tiny_train(**kw) -> TrainConfig:
    return replace(TrainConfig(steps=12, batch_size=4, eval_windows=4, dtype="fp32", device="cpu"), **kw)


@pytest.mark.slow
def test_tiny_train_learns_and_reports_every_key(cli):
    proc = cli("train", *TINY, "--steps", "80", "--reuse-map", "2,1", "--json", check=True)
    report = json.loads(proc.stdout)
    assert TRAIN_KEYS <= set(report)
    assert report["status"] == "ok" and report["steps"] == 80 and report["reuse_map"] == [2, 1]
    assert report["val_bpb"] < 5.0, report  # a uniform guess over bytes is 8 bits per byte
    assert report["val_ppl"] == pytest.approx(math.exp(report["val_loss"]))
    assert [p["step"] for p in report["curve"]] == [10, 20, 40, 80]
    assert all(set(p) == {"step", "tokens", "val_loss"} for p in report["curve"])


def test_same_seed_same_losses_and_maps_see_the_same_batches(stdlib_tokens):
    cfg, tc = tiny_model(), tiny_train()
    a = train_proxy(cfg, reuse_map_schedule([1, 1]), stdlib_tokens, tc)
    b = train_proxy(cfg, reuse_map_schedule([1, 1]), stdlib_tokens, tc)
    c = train_proxy(cfg, reuse_map_schedule([3, 1]), stdlib_tokens, tc)
    assert [p.val_loss for p in a.curve] == [p.val_loss for p in b.curve]
    assert a.batch_digest == b.batch_digest == c.batch_digest != 0
    assert [p.val_loss for p in a.curve] != [p.val_loss for p in c.curve]
    other_seed = train_proxy(cfg, reuse_map_schedule([1, 1]), stdlib_tokens, replace(tc, seed=1))
    assert other_seed.batch_digest != a.batch_digest


def test_validation_windows_are_fixed(stdlib_tokens):
    first = list(stdlib_tokens.val_batches(8, 64, 4))
    second = list(stdlib_tokens.val_batches(8, 64, 4))
    assert all((x1 == x2).all() for (x1, _), (x2, _) in zip(first, second, strict=True))
    assert stdlib_tokens.val_bytes(8, 64) == 8 * 64  # byte tokens cover one byte each


@pytest.mark.slow
def test_second_load_reads_the_cache_without_tokenizing(tmp_path):
    cfg = DataConfig(corpus=str(write_text(tmp_path / "a.txt", "hello world\n" * 500)))
    first = load_tokens(cfg, root=tmp_path / "cache")
    listing = sorted((p.name, p.stat().st_mtime_ns) for p in first.path.iterdir())
    second = load_tokens(cfg, root=tmp_path / "cache")
    assert first.built and not second.built
    assert sorted((p.name, p.stat().st_mtime_ns) for p in second.path.iterdir()) == listing
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".building")]
    assert (np.asarray(first.train.tokens) == np.asarray(second.train.tokens)).all()


def test_a_tokenizer_file_is_cached_by_its_content_not_its_path(tmp_path):
    """The same tokenizer.json in two folders reads one cache entry; a file of other bytes its own."""
    from ilr_search.data.tokenizers import byte_tokenizer_model

    corpus = str(write_text(tmp_path / "a.txt", "hello world\n" * 500))
    paths = [tmp_path / folder / "tokenizer.json" for folder in ("one", "two")]
    for path in paths:
        path.parent.mkdir()
        byte_tokenizer_model().save(str(path))
    first, second = (
        load_tokens(DataConfig(corpus=corpus, tokenizer=f"file:{p}"), root=tmp_path / "cache") for p in paths
    )
    assert first.built and not second.built and first.path == second.path
    paths[1].write_text(json.dumps(json.loads(paths[1].read_text()), indent=2))  # other bytes: another file
    other = load_tokens(DataConfig(corpus=corpus, tokenizer=f"file:{paths[1]}"), root=tmp_path / "cache")
    assert other.built and other.path != first.path


def test_stdlib_cache_is_shared_by_runs(stdlib_tokens, token_cache):
    again = load_tokens(DataConfig(), root=token_cache)
    assert not again.built and again.path == stdlib_tokens.path
    meta = stdlib_tokens.meta
    assert meta["documents"]["val"] > 0 and 0.02 < meta["tokens"]["val"] / sum(meta["tokens"].values()) < 0.12


@pytest.mark.slow
def test_bpe_trains_offline_on_the_embedded_corpus(token_cache):
    # the tokenizer learns its merges from the whole training split; 200k tokens of it are encoded (encoding
    # all 7.5M took 4 of this test's 6 seconds on a quiet machine)
    data = load_tokens(DataConfig(tokenizer="bpe:320", max_train_tokens=200_000), root=token_cache)
    assert data.vocab_size == 320 and (data.path / "tokenizer.json").exists()
    assert len(data.train.tokens) == 200_000 and int(np.asarray(data.train.tokens).max()) >= 256  # merges are used
    # bytes per token sum to the text's UTF-8 size, so bits per byte compare across tokenizers
    assert data.val.token_bytes is not None and 1.5 < data.val.token_bytes.mean() < 4
    result = train_proxy(tiny_model(320), reuse_map_schedule([1, 1]), data, tiny_train(steps=4))
    assert result.status == "ok" and math.isfinite(result.val_bpb)


def write_text(path, text):
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("suffix", ["txt", "jsonl", "csv", "parquet"])
def test_local_formats(tmp_path, suffix):
    import pandas as pd

    rows = [f"document {i}: " + "the quick brown fox jumps over the lazy dog. " * 5 for i in range(200)]
    path = tmp_path / f"corpus.{suffix}"
    if suffix == "txt":
        path.write_text("\n".join(rows))
    elif suffix == "jsonl":
        pd.DataFrame({"body": rows}).to_json(path, orient="records", lines=True)
    elif suffix == "csv":
        pd.DataFrame({"body": rows}).to_csv(path, index=False)
    else:
        pd.DataFrame({"body": rows}).to_parquet(path)
    data = load_tokens(DataConfig(corpus=str(path), text_column="body"), root=tmp_path / "cache")
    assert len(data.train) > len(data.val) > 0
    text = bytes(np.asarray(data.train.tokens[:40], dtype=np.uint8)).decode()
    assert "the quick brown fox" in text or "document" in text


def test_diverging_run_reports_status_without_raising(stdlib_tokens):
    result = train_proxy(
        tiny_model(), reuse_map_schedule([1, 1]), stdlib_tokens, tiny_train(lr=1e6, grad_clip=1e9, steps=30)
    )
    assert result.status == "diverged" and result.reason and result.val_ppl != result.val_ppl  # NaN


@pytest.mark.slow
def test_eval_callback_stops_the_run(stdlib_tokens):
    seen = []
    result = train_proxy(
        tiny_model(),
        reuse_map_schedule([1, 1]),
        stdlib_tokens,
        tiny_train(),
        on_eval=lambda p: seen.append(p.step) or p.step >= 3,
    )
    assert result.status == "stopped" and result.steps == 3 and seen == [2, 3]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["missing", "empty", "too-small", "tokenizer", "zero", "length", "non-integer", "hf"])
def test_train_bad_input(cli, tmp_path, case):
    args = {
        "missing": ["--data", str(tmp_path / "nope.txt")],
        "empty": ["--data", str(write_text(tmp_path / "empty.txt", ""))],
        "too-small": ["--data", str(write_text(tmp_path / "small.txt", "tiny corpus\n"))],
        "tokenizer": ["--tokenizer", "sentencepiece:12"],
        "zero": ["--reuse-map", "0,1"],
        "length": ["--reuse-map", "1,1,1"],
        "non-integer": ["--reuse-map", "two,1"],
        "hf": ["--data", "hf:nobody/no-such-dataset-xyz"],
    }[case]
    cache = tmp_path / "cache"
    proc = cli("train", *TINY, "--steps", "2", *args, env={"ILR_SEARCH_CACHE": str(cache)})
    assert_one_line_error(proc)
    assert not cache.exists() or not any(p.name.startswith("tokens-") for p in cache.iterdir())
