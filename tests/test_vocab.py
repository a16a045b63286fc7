"""`flops`, `train` and `run` build the same model for a bpe:N tokenizer, even where the corpus runs out of
merges before N (the trained tokenizer is smaller than N)."""

import json

from conftest import ROOT

MODEL = [
    "--space",
    str(ROOT / "tests" / "spaces" / "tiny.toml"),
    "--layers",
    "2",
    "--d-model",
    "16",
    "--seq-len",
    "32",
    "--tokenizer",
    "bpe:1000",
]


def test_train_and_flops_agree_on_the_vocabulary_of_a_short_bpe(cli, tmp_path):
    corpus = tmp_path / "small.txt"
    corpus.write_text("abc abd abe " * 4000 + "\n", encoding="utf-8")  # a few merges exist, not 700
    flops = json.loads(cli("flops", *MODEL, "--json", check=True).stdout)  # flops takes no data: bpe:N alone sizes it
    train = json.loads(
        cli(
            "train",
            *MODEL,
            "--steps",
            "4",
            "--batch-size",
            "2",
            "--data",
            str(corpus),
            "--reuse-map",
            "1,1",
            "--json",
            check=True,
        ).stdout
    )
    assert train["params"] == flops["params"], (train["params"], flops["params"])
    assert train["status"] == "ok"
