"""The answer objective: prompt/answer rows, whose loss is on the answer tokens only.

The rows are arithmetic ("12+7=" / "19") written by the tests with a fixed seed; the byte tokenizer, so that a
token is a byte and the mask can be checked by decoding. Real tiny models on CPU, fp32."""

import json
import math
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import NO_REFERENCES, assert_one_line_error, write_space

from ilr_search.config import DataConfig, ModelConfig, TrainConfig
from ilr_search.data.corpora import split_documents
from ilr_search.data.tokens import IGNORE_INDEX, ROW_END, load_tokens
from ilr_search.training.fused import train_fused
from ilr_search.training.loss import linear_cross_entropy
from ilr_search.training.train import build_model, evaluate, train_proxy

SEQ_LEN = 32


def write_rows(path: Path, n: int = 400, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for _ in range(n):
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
    return path


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> Path:
    return write_rows(tmp_path_factory.mktemp("rows") / "rows.jsonl")


@pytest.fixture(scope="module")
def data_cfg(rows) -> DataConfig:
    return DataConfig(corpus=str(rows), text_column="prompt", answer_column="answer")


@pytest.fixture(scope="module")
def data(data_cfg, token_cache):
    return load_tokens(data_cfg, root=token_cache, seq_len=SEQ_LEN)


def tiny_model() -> ModelConfig:
    return ModelConfig(vocab_size=256, n_layers=2, d_model=16, n_heads=2, seq_len=SEQ_LEN)


def tiny_train(**kw) -> TrainConfig:
    base = TrainConfig(
        steps=50,
        batch_size=8,
        lr=3e-3,
        eval_fractions=(0.02, 1.0),
        eval_windows=16,
        dtype="fp32",
        device="cpu",
        checkpoint_every=0,
    )
    return replace(base, **kw)


def test_the_mask_marks_exactly_the_answer_tokens_and_rows_are_split_whole(data, data_cfg):
    train_docs, val_docs = split_documents(data_cfg, 0)
    assert not {d.key for d in train_docs} & {d.key for d in val_docs}  # rows, not tokens, are split
    for split, docs in ((data.train, train_docs), (data.val, val_docs)):
        tokens = np.asarray(split.tokens)
        mask = np.asarray(split.answer_mask)
        assert bytes(tokens.astype(np.uint8)).decode() == "".join(d.text + d.answer + ROW_END for d in docs)
        expected = np.concatenate(
            [np.r_[np.zeros(len(d.text), np.uint8), np.ones(len(d.answer), np.uint8), 0] for d in docs]
        )
        assert np.array_equal(mask, expected)
        begins, ends = split.answer_spans()
        assert [bytes(tokens[b:e].astype(np.uint8)).decode() for b, e in zip(begins, ends, strict=True)] == [
            d.answer for d in docs
        ]
    # a masked and an unmasked cache of the same file never mix
    plain = load_tokens(replace(data_cfg, text_column="answer", answer_column=""), root=data.path.parent)
    assert plain.path != data.path and plain.train.answer_mask is None and plain.ignore_index is None


def test_training_batches_count_answer_targets_only(data):
    x, y = data.train_batch(3, 4, SEQ_LEN, seed=0)
    for row_x, row_y in zip(x, y, strict=True):
        counted = row_y != IGNORE_INDEX
        assert counted.any() and not counted.all()
        assert all(chr(t).isdigit() for t in row_y[counted])  # answers are digits; '+', '=' and row ends never count
        assert np.array_equal(row_x[1:][counted[:-1]], row_y[:-1][counted[:-1]])  # targets are the next tokens


def test_validation_windows_end_at_an_answer_and_count_it_alone(data):
    windows = data.val_windows(16, SEQ_LEN)
    begins, ends = data.val.answer_spans()
    assert len(windows.starts) == min(16, len(ends))
    assert set(windows.ends) <= set(ends)
    for (_x, y), s in zip(data.val_batches(16, SEQ_LEN, 16), [windows.starts], strict=True):
        for row_y, start, end in zip(y, s, windows.ends, strict=True):
            assert start + SEQ_LEN >= end - 1  # the window ends at (or after) its answer's last token
            counted = np.flatnonzero(row_y != IGNORE_INDEX) + start + 1
            answer = np.arange(begins[list(ends).index(end)], end)
            assert np.array_equal(counted, answer)


def test_the_answer_loss_equals_cross_entropy_over_the_answer_positions(data):
    model_cfg = tiny_model()
    model = build_model(model_cfg, seed=0)
    cfg = tiny_train()
    loss, ppl, bpb = evaluate(model, list(range(model_cfg.n_layers)), data, cfg, torch.device("cpu"), torch.float32)

    # By hand: each validation window's logits, the cross-entropy at the positions of the last answer it holds.
    mask = np.asarray(data.val.answer_mask)
    tokens = np.asarray(data.val.tokens).astype(np.int64)
    begins, ends = data.val.answer_spans()
    rows = np.unique(np.linspace(0, len(ends) - 1, num=cfg.eval_windows).astype(np.int64))
    nats, counted = 0.0, 0
    with torch.no_grad():
        for end in ends[rows]:
            start = max(0, end - 1 - SEQ_LEN)
            window = torch.from_numpy(tokens[start : start + SEQ_LEN + 1])
            logits = model(window[None, :-1], list(range(model_cfg.n_layers)))[0]
            targets = np.arange(start + 1, start + SEQ_LEN + 1)
            last = [p for p in range(end - 1, start, -1) if mask[p]]
            last_run = [p for i, p in enumerate(last) if p == end - 1 - i]  # the contiguous answer ending at `end`
            positions = torch.tensor([p - start - 1 for p in last_run])
            nats += F.cross_entropy(logits[positions], window[1:][positions], reduction="sum").item()
            counted += len(positions)
            assert all(targets[p] == q for p, q in zip(positions.tolist(), last_run, strict=True))
    assert loss == pytest.approx(nats / counted, rel=1e-5)
    assert ppl == pytest.approx(math.exp(nats / counted), rel=1e-5)
    assert bpb == pytest.approx(nats / math.log(2) / counted, rel=1e-5)  # byte tokenizer: a byte a token


def test_ignored_targets_count_for_nothing_in_the_loss_and_its_gradients():
    torch.manual_seed(0)
    h = torch.randn(2, 5, 8, requires_grad=True)
    w = torch.randn(11, 8, requires_grad=True)
    y = torch.randint(0, 11, (2, 5))
    y[0, :3] = IGNORE_INDEX
    y[1, 4] = IGNORE_INDEX
    for reduction in ("mean", "sum"):
        ours = linear_cross_entropy(h, w, y, reduction=reduction, ignore_index=IGNORE_INDEX)
        g_ours = torch.autograd.grad(ours, (h, w))
        ref = F.cross_entropy(
            (h @ w.t()).reshape(-1, 11), y.reshape(-1), ignore_index=IGNORE_INDEX, reduction=reduction
        )
        g_ref = torch.autograd.grad(ref, (h, w))
        assert ours.item() == pytest.approx(ref.item(), rel=1e-5)
        for a, b in zip(g_ours, g_ref, strict=True):
            assert torch.allclose(a, b, atol=1e-6)
    none = torch.full((2, 5), IGNORE_INDEX)
    empty = linear_cross_entropy(h, w, none, ignore_index=IGNORE_INDEX)  # no answer token: 0, not 0/0
    assert empty.item() == 0.0
    assert all(torch.count_nonzero(g) == 0 for g in torch.autograd.grad(empty, (h, w)))


def test_training_on_the_answer_loss_lowers_it_and_the_fused_trainer_agrees(data):
    model_cfg, cfg = tiny_model(), tiny_train()
    schedule = [0, 1, 1]
    single = train_proxy(model_cfg, schedule, data, cfg)
    assert single.status == "ok"
    first, last = single.curve[0].val_loss, single.curve[-1].val_loss
    assert last < first - 1.0, (first, last)  # from ~ln 256 toward the digits' entropy
    fused = train_fused(model_cfg, [schedule, [0, 1]], data, cfg)
    assert fused[0].val_loss == pytest.approx(single.val_loss, abs=1e-4)
    assert fused[0].batch_digest == single.batch_digest


def test_run_with_the_answer_objective_reports_answer_losses(cli, rows, tmp_path):
    space = write_space(tmp_path / "space.toml", search=NO_REFERENCES)
    common = [
        "--space",
        str(space),
        "--data",
        str(rows),
        "--text-column",
        "prompt",
        "--answer-column",
        "answer",
        "--seq-len",
        str(SEQ_LEN),
        "--steps",
        "10",
    ]
    proc = cli(
        "run",
        *common,
        "--objective",
        "answer",
        "--budget",
        "1.5x",
        "--n-trials",
        "3",
        "--target",
        "1x",
        "--json",
        check=True,
    )
    report = json.loads(proc.stdout)
    assert "-answer-" in report["study"]
    trials = json.loads(cli("trials", "--study", report["study"], "--json", check=True).stdout)["trials"]
    complete = [t for t in trials if t["state"] == "COMPLETE"]
    assert len(complete) == 3
    # The baseline trial's loss is the answer loss `train` reports for the same map, data and seed.
    baseline = next(t for t in complete if t["map"] == "1,1,1,1")
    trained = json.loads(cli("train", *common, "--reuse-map", "1,1,1,1", "--json", check=True).stdout)
    assert baseline["curves"]["val"][-1]["loss"] == pytest.approx(trained["val_loss"], rel=1e-6)
    assert baseline["val_ppl"] == pytest.approx(trained["val_ppl"], rel=1e-6)


@pytest.mark.parametrize(
    "args",
    [
        ["--objective", "answer", "--data", "{rows}", "--text-column", "prompt"],  # no --answer-column
        [
            "--objective",
            "answer",
            "--answer-column",
            "nope",
            "--data",
            "{rows}",
            "--text-column",
            "prompt",
        ],  # no such column
        ["--objective", "answer", "--answer-column", "answer"],  # the embedded corpus: no rows
        ["--answer-column", "answer", "--data", "{rows}", "--text-column", "prompt"],  # answers searched as pareto
        ["--objective", "answer", "--answer-column", "answer", "--data", "{text}"],  # a .txt file has no columns
    ],
)
def test_bad_answer_inputs_exit_2_with_one_line_and_write_nothing(cli, rows, tmp_path, args):
    text = tmp_path / "plain.txt"
    text.write_text("12+7=19\n" * 50)
    work = tmp_path / "work"
    work.mkdir()
    cache = tmp_path / "cache"
    args = [a.format(rows=rows, text=text) for a in args]
    proc = cli(
        "run",
        "--space",
        str(TINY),
        "--budget",
        "1.5x",
        "--n-trials",
        "1",
        *args,
        cwd=work,
        env={"ILR_SEARCH_CACHE": str(cache)},
    )
    assert_one_line_error(proc)
    assert not any(work.iterdir()) and not cache.exists()


TINY = Path(__file__).resolve().parent / "spaces" / "tiny.toml"


def test_frozen_window_chunks_of_answer_rows_are_disjoint_and_count_answers_alone(data):
    """A frozen evaluation (steps 0) deals the validation rows into disjoint chunks; each window counts its row's
    answer alone, and a chunk's loss is the mean over those answer tokens, as evaluate's over the same windows."""
    from ilr_search.config import TrainConfig
    from ilr_search.training.frozen import chunk_scores

    n = 8
    begins, ends = data.val.answer_spans()
    chunks = data.window_chunks(n, SEQ_LEN)
    assert chunks == len(ends) // n and chunks >= 2
    first, second = data.window_chunk(0, n, SEQ_LEN), data.window_chunk(1, n, SEQ_LEN)
    assert not set(first.ends) & set(second.ends) and set(first.ends) <= set(ends)
    model_cfg = tiny_model()
    model = build_model(model_cfg, seed=0).eval()
    schedule = list(range(model_cfg.n_layers))
    (losses,) = chunk_scores(
        model_cfg, schedule, data, TrainConfig(steps=0, eval_windows=n, batch_size=8, device="cpu", dtype="fp32"), [0]
    )
    answer_lengths = [int(e - b) for b, e in zip(first.begins, first.ends, strict=True)]
    assert list(losses.counts) == answer_lengths
    nats = 0.0
    with torch.no_grad():
        for x, y in data.window_batches(first, SEQ_LEN, n):
            nats += linear_cross_entropy(
                model.hidden(torch.from_numpy(x), schedule),
                model.head_weight,
                torch.from_numpy(y),
                reduction="sum",
                ignore_index=IGNORE_INDEX,
            ).item()
    assert losses.val_loss == pytest.approx(nats / sum(answer_lengths), rel=1e-6)
