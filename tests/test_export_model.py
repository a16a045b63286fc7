"""Standard checkpoints of the project's models (commands/export.py): `train --save DIR --format hf` and
`export-model --model DIR --map MAP` write what transformers' AutoModelForCausalLM loads with no custom code, with
the logits of the project's model run under that schedule; `export-model --study` refuses a study that kept no
weights; bad input is one error line and writes nothing."""

import json
import sqlite3

import pytest
import torch
from conftest import ROOT, TINY_SPACE, assert_one_line_error

transformers = pytest.importorskip("transformers")

TINY = str(TINY_SPACE)
TRAINED_MAP = "2,2,1,1"


def project_logits(folder, schedule, x: torch.Tensor) -> torch.Tensor:
    from ilr_search.training.model import ILRTransformer

    model, _ = ILRTransformer.load(folder)
    with torch.no_grad():
        return model(x, schedule)


def check_checkpoint(out, expected: torch.Tensor, x: torch.Tensor, layers: int) -> None:
    """transformers reads `out` as a plain model of `layers` layers, with the expected logits; it generates."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert hf.config.num_hidden_layers == layers
    with torch.no_grad():
        logits = hf(input_ids=x, use_cache=False).logits
    assert (logits - expected).abs().max().item() < 1e-4
    generated = hf.generate(x[:, :8], max_new_tokens=5, do_sample=False)
    assert generated.shape == (x.shape[0], 13)


def tokens(vocab: int = 256, length: int = 32) -> torch.Tensor:
    return torch.randint(0, vocab, (2, length), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def native(tmp_path_factory, token_cache):
    """A model of the tiny space trained with map 2,2,1,1 and saved natively, once for the module."""
    from ilr_search.commands.api import train_report

    folder = tmp_path_factory.mktemp("native") / "model"
    train_report(TINY, {"train": {"steps": 20}}, TRAINED_MAP, save=folder)
    return folder


def test_export_model_writes_the_distinct_layers_as_a_plain_model(native, cli, tmp_path):
    out = tmp_path / "plain"
    report = json.loads(
        cli("export-model", "--model", str(native), "--map", "1,1,1,1", "--out", str(out), "--json", check=True).stdout
    )
    assert report["schedule"] == [0, 1, 2, 3] and report["family"] == "llama" and report["layers"] == 4
    x = tokens()
    check_checkpoint(out, project_logits(native, [0, 1, 2, 3], x), x, layers=4)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer("héllo", add_special_tokens=False)["input_ids"] == list("héllo".encode())
    assert not [p.name for p in tmp_path.iterdir() if p.name != "plain"]  # no temporary folder left


def test_export_model_unrolls_the_trained_schedule_by_default(native, cli, tmp_path):
    out = tmp_path / "unrolled"
    proc = cli("export-model", "--model", str(native), "--out", str(out), check=True)
    assert "map 2,2,1,1" in proc.stdout and "0,0,1,1,2,3" in proc.stdout
    x = tokens()
    check_checkpoint(out, project_logits(native, [0, 0, 1, 1, 2, 3], x), x, layers=6)


def test_a_block_map_is_unrolled(native, cli, tmp_path):
    out = tmp_path / "block"
    report = json.loads(
        cli(
            "export-model", "--model", str(native), "--map", "block:1-2:2", "--out", str(out), "--json", check=True
        ).stdout
    )
    assert report["schedule"] == [0, 1, 2, 1, 2, 3]
    x = tokens()
    check_checkpoint(out, project_logits(native, [0, 1, 2, 1, 2, 3], x), x, layers=6)


def test_train_format_hf_writes_the_trained_model_unrolled(native, cli, tmp_path):
    """Training is deterministic on the CPU: the same command saved natively (the module's model) and as hf."""
    out = tmp_path / "hf"
    report = json.loads(
        cli(
            "train",
            "--space",
            TINY,
            "--reuse-map",
            TRAINED_MAP,
            "--steps",
            "20",
            "--save",
            str(out),
            "--format",
            "hf",
            "--json",
            check=True,
        ).stdout
    )
    assert report["saved"] == str(out) and report["status"] == "ok"
    saved = json.loads((native / "config.json").read_text())
    assert report["val_loss"] == pytest.approx(saved["result"]["val_loss"], abs=1e-6)
    x = tokens()
    check_checkpoint(out, project_logits(native, [0, 0, 1, 1, 2, 3], x), x, layers=6)


def test_a_bpe_tokenizer_goes_with_the_model(cli, tmp_path):
    """bpe:N: the tokenizer the run trained is written beside the weights (and kept in a native save)."""
    from tokenizers import Tokenizer

    text = tmp_path / "small.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(300)))
    common = [
        "train",
        "--space",
        TINY,
        "--reuse-map",
        "1,1,1,1",
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--data",
        str(text),
        "--tokenizer",
        "bpe:300",
    ]
    cli(*common, "--save", str(tmp_path / "hf"), "--format", "hf", check=True)
    cli(*common, "--save", str(tmp_path / "native"), check=True)
    native_tokenizer = Tokenizer.from_file(str(tmp_path / "native" / "tokenizer.json"))
    cli("export-model", "--model", str(tmp_path / "native"), "--out", str(tmp_path / "again"), check=True)
    sample = "the lazy dog jumps"
    expected = native_tokenizer.encode(sample).ids
    assert len(expected) < len(sample)  # merges, not bytes
    for out in ("hf", "again"):
        tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / out)
        assert tokenizer(sample, add_special_tokens=False)["input_ids"] == expected


def test_a_model_trained_from_a_checkpoint_is_written_in_its_family(cli, tmp_path):
    """--init of a Qwen3 checkpoint (q/k norms): --format hf writes Qwen3, with the checkpoint's tokenizer files."""
    from ilr_search.data.tokenizers import byte_tokenizer_model

    config = transformers.Qwen3Config(
        vocab_size=260,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "qwen")
    byte_tokenizer_model().save(str(tmp_path / "qwen" / "tokenizer.json"))
    text = tmp_path / "small.txt"
    text.write_text("".join(f"line {i}: the quick brown fox.\n" for i in range(300)))
    common = [
        "train",
        "--init",
        str(tmp_path / "qwen"),
        "--reuse-map",
        "1,2",
        "--seq-len",
        "32",
        "--steps",
        "3",
        "--batch-size",
        "2",
        "--data",
        str(text),
    ]
    cli(*common, "--save", str(tmp_path / "hf"), "--format", "hf", check=True)
    cli(*common, "--save", str(tmp_path / "native"), check=True)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "qwen3"
    assert (tmp_path / "native" / "tokenizer.json").is_file()
    x = tokens(260, 16)
    check_checkpoint(tmp_path / "hf", project_logits(tmp_path / "native", [0, 1, 1], x), x, layers=3)


@pytest.fixture(scope="module")
def nope_model(tmp_path_factory, token_cache):
    """A model without positional encoding (pe nope), which no standard checkpoint expresses."""
    from ilr_search.commands.api import train_report

    folder = tmp_path_factory.mktemp("nope") / "model"
    train_report(TINY, {"model": {"pe": "nope"}, "train": {"steps": 2}}, "1,1,1,1", save=folder)
    return folder


@pytest.fixture
def scratch_study(tmp_path):
    """A study trained from scratch (the stored test fixture's)."""
    with sqlite3.connect(tmp_path / "old.db") as conn:
        conn.executescript((ROOT / "tests" / "fixtures" / "study-eeb668a.sql").read_text(encoding="utf-8"))
    return f"sqlite:///{tmp_path / 'old.db'}"


def test_a_study_that_trained_its_maps_is_refused_with_the_command_that_makes_the_weights(scratch_study, cli, tmp_path):
    proc = cli(
        "export-model",
        "--study",
        "before-typed-records",
        "--storage",
        scratch_study,
        "--map",
        "2,1,1,1",
        "--out",
        str(tmp_path / "out"),
    )
    assert_one_line_error(proc)
    assert "from scratch" in proc.stderr and "train --from-study before-typed-records --map '2,1,1,1'" in proc.stderr
    assert "--format hf" in proc.stderr and not (tmp_path / "out").exists()


BAD_EXPORTS = {
    "knobs in the map": ["--model", "{native}", "--map", "2,1,1,1|injection=add"],
    "a map longer than the model": ["--model", "{native}", "--map", "1,1,1,1,1"],
    "pe nope": ["--model", "{nope}", "--map", "1,1,1,1"],
    "an unknown family": ["--model", "{native}", "--family", "gpt2"],
    "a family without the model's norms": ["--model", "{native}", "--family", "qwen3"],
    "an unknown study": ["--study", "nope", "--storage", "{storage}"],
    "an unknown storage": ["--study", "nope", "--storage", "sqlite:///{tmp}/none.db"],
    "a --model folder without the native files": ["--model", "{tmp}"],
    "a --model folder that is not there": ["--model", "{tmp}/none"],
    "both --model and --study": ["--model", "{native}", "--study", "x"],
    "neither": [],
}


@pytest.mark.parametrize("case", BAD_EXPORTS)
def test_bad_export_input_is_one_error_line_and_writes_nothing(case, native, nope_model, scratch_study, cli, tmp_path):
    tmp = tmp_path / "empty"
    tmp.mkdir()
    args = [a.format(native=native, nope=nope_model, storage=scratch_study, tmp=tmp) for a in BAD_EXPORTS[case]]
    out = tmp_path / "out"
    assert_one_line_error(cli("export-model", *args, "--out", str(out)))
    assert not out.exists() and not list(tmp.iterdir())


@pytest.mark.parametrize("what", ["a non-empty folder", "a file"])
def test_out_must_be_new_or_empty(what, native, cli, tmp_path):
    out = tmp_path / "out"
    if what == "a file":
        out.write_text("x")
    else:
        out.mkdir()
        (out / "keep.txt").write_text("x")
    assert_one_line_error(cli("export-model", "--model", str(native), "--map", "1,1,1,1", "--out", str(out)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert out.is_file() or [p.name for p in out.iterdir()] == ["keep.txt"]


def test_an_hf_checkpoint_is_not_a_native_model(native, cli, tmp_path):
    cli("export-model", "--model", str(native), "--out", str(tmp_path / "hf"), check=True)
    assert_one_line_error(cli("export-model", "--model", str(tmp_path / "hf"), "--out", str(tmp_path / "again")))
    assert not (tmp_path / "again").exists()


@pytest.mark.parametrize("args", [["--knobs", "injection"], ["--pe", "alibi"], ["--format", "onnx"]])
def test_train_format_hf_refuses_before_training(args, cli, tmp_path):
    out = tmp_path / "out"
    fmt = [] if "--format" in args else ["--format", "hf"]
    proc = cli("train", "--space", TINY, "--reuse-map", "2,1,1,1", "--steps", "2", "--save", str(out), *fmt, *args)
    assert_one_line_error(proc)
    assert not out.exists()


def test_format_goes_with_save(cli):
    assert_one_line_error(cli("train", "--space", TINY, "--reuse-map", "2,1,1,1", "--format", "hf"))


@pytest.fixture(scope="module")
def frozen_study(tmp_path_factory, token_cache):
    """A frozen study (run --init --train-steps 0, no race) of a tiny Llama checkpoint of random weights."""
    from conftest import write_space

    from ilr_search.commands.api import with_init
    from ilr_search.config import ModelConfig
    from ilr_search.search.run import RunRequest, run_in_process
    from ilr_search.space import load_space
    from ilr_search.training.model import ILRTransformer
    from ilr_search.training.pretrained import export_checkpoint

    root = tmp_path_factory.mktemp("frozen-export")
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=256, n_layers=4, d_model=32, n_heads=2, seq_len=64)
    checkpoint = export_checkpoint(ILRTransformer(cfg), [0, 1, 2, 3], root / "tiny-llama")
    space = write_space(
        root / "space.toml",
        search={"noise_seeds": 0, "families": ["ilr"], "n_trials": 3},
        train={"steps": 0, "eval_windows": 8},
    )
    url = f"sqlite:///{root / 'frozen.db'}"
    summary = run_in_process(
        RunRequest(with_init(load_space(space), str(checkpoint)), "1.5x", "frozen", url, checkpoint_dir=root / "ck")
    )
    return checkpoint, url, summary


def test_a_frozen_study_exports_its_checkpoint_under_a_map(frozen_study, cli, tmp_path):
    from ilr_search.training.pretrained import open_checkpoint
    from ilr_search.training.train import build_model

    checkpoint, url, _ = frozen_study
    out = tmp_path / "best"
    proc = cli("export-model", "--study", "frozen", "--storage", url, "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert "lowest perplexity" in proc.stderr and report["family"] == "llama"
    out = tmp_path / "2111"
    report = json.loads(
        cli(
            "export-model",
            "--study",
            "frozen",
            "--storage",
            url,
            "--map",
            "2,1,1,1",
            "--out",
            str(out),
            "--json",
            check=True,
        ).stdout
    )
    assert report["schedule"] == [0, 0, 1, 2, 3]
    model = build_model(open_checkpoint(str(checkpoint), seq_len=64).config, seed=1).eval()
    x = tokens()
    with torch.no_grad():
        expected = model(x, [0, 0, 1, 2, 3])
    check_checkpoint(out, expected, x, layers=5)
    assert transformers.AutoConfig.from_pretrained(out).max_position_embeddings == 64  # the checkpoint's
