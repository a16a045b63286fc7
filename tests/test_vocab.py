"""`flops`, `train` and `run` build the same model for a bpe:N tokenizer, even where the corpus runs out of
merges before N (the trained tokenizer is smaller than N)."""

import json

from conftest import ROOT

TINY = ["--space", str(ROOT / "tests" / "spaces" / "tiny.toml"), "--layers", "2", "--d-model", "16",
        "--seq-len", "32", "--steps", "4", "--batch-size", "2"]


def test_train_and_flops_agree_on_the_vocabulary_of_a_short_bpe(cli, tmp_path):
    corpus = tmp_path / "small.txt"
    corpus.write_text("abc abd abe " * 4000 + "\n", encoding="utf-8")  # a few merges exist, not 700
    args = [*TINY, "--data", str(corpus), "--tokenizer", "bpe:1000", "--json"]
    flops = json.loads(cli("flops", *args, check=True).stdout)
    train = json.loads(cli("train", *args, "--reuse-map", "1,1", check=True).stdout)
    assert train["params"] == flops["params"], (train["params"], flops["params"])
    assert train["status"] == "ok"
