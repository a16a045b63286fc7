"""Task items scored one at a time by a frozen study (`--objective choice|exact`, data/items.py, training/frozen.py):
each item's score equals an independent computation with transformers on the exported model, two maps are paired by
item, the race tests them by item and says "accuracy", and bad item files are one error line."""

import json
import random
import sqlite3
from pathlib import Path

import pytest
import torch
import transformers
from conftest import assert_one_line_error, frozen_run_args, write_space

from ilr_search.config import TrainConfig
from ilr_search.data.corpora import stdlib_documents
from ilr_search.data.items import ItemColumns, ItemTask, load_items
from ilr_search.data.tokenizers import build_tokenizer
from ilr_search.training.build import build_model
from ilr_search.training.frozen import chunk_scores
from ilr_search.training.pretrained import export_checkpoint, open_checkpoint

# frozen and trained studies that race, as on one core: no race worker processes (conftest.one_core)
pytestmark = pytest.mark.usefixtures("one_usable_core")

SEQ = 64
PER_CHUNK = 16
RECURRENT = [0, 0, 1, 1, 2, 3]  # 2,2,1,1


def code_lines(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = [
        line.strip()
        for _, text in stdlib_documents()[:300]
        for line in text.splitlines()
        if len(line.strip()) >= 40 and not line.strip().startswith("#")
    ]
    rng.shuffle(lines)
    return lines[:n]


def write_choice_items(path: Path, n: int = 96, seed: int = 0) -> Path:
    """Code completion as multiple choice: a line's first 24 characters, its next 8 among the same 8 characters of
    three other lines."""
    rng = random.Random(seed)
    lines = code_lines(4 * n, seed)
    rows = []
    for line in lines[:n]:
        choices = [line[24:32]] + [other[24:32] for other in rng.sample(lines[n:], 3)]
        rng.shuffle(choices)
        rows.append({"prompt": line[:24], "choices": choices, "answer": choices.index(line[24:32])})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def model(recurrent_checkpoint):
    cfg = open_checkpoint(str(recurrent_checkpoint), seq_len=SEQ).config
    return cfg, build_model(cfg, 0).eval()


@pytest.fixture(scope="module")
def unrolled(recurrent_checkpoint, model, tmp_path_factory):
    """The checkpoint's model under each schedule as a plain transformers model (its layers unrolled)."""
    _, ilr = model
    out = {}
    for name, schedule in (("plain", [0, 1, 2, 3]), ("recurrent", RECURRENT)):
        folder = export_checkpoint(
            ilr, schedule, tmp_path_factory.mktemp("unrolled") / name, tokenizer_dir_or_file=recurrent_checkpoint
        )
        out[name] = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    return out


def tokenizer(checkpoint: Path):
    return build_tokenizer(f"file:{checkpoint / 'tokenizer.json'}", [], Path("."))


def frozen_cfg() -> TrainConfig:
    return TrainConfig(steps=0, eval_windows=PER_CHUNK, batch_size=8, device="cpu", dtype="fp32")


def write_digit_items(path: Path, n: int = 96) -> Path:
    """Items whose choices are one token each (the digits, byte tokens): read once, scored at the prompt's end."""
    lines = code_lines(n, seed=5)
    rows = [{"prompt": line[:20], "choices": list("0123456789"), "answer": i % 10} for i, line in enumerate(lines)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("write", [write_choice_items, write_digit_items])
def test_choice_scores_are_lm_evals_rule_on_the_transformers_model(
    recurrent_checkpoint, model, unrolled, tmp_path, write
):
    """An item is right when its correct choice has the highest summed log-likelihood after the prompt (not
    length-normalised): computed here choice by choice with transformers, for two schedules, item by item; choices of
    one token each (the digits) are read once, at the prompt's end, with the same result."""
    cfg, _ = model
    items = load_items(str(write(tmp_path / "items.jsonl")), ItemColumns("prompt", "answer", "choices"))
    task = ItemTask("choice", items, tokenizer(recurrent_checkpoint))
    for name, schedule in (("plain", [0, 1, 2, 3]), ("recurrent", RECURRENT)):
        scores = chunk_scores(cfg, schedule, task, frozen_cfg(), [0, 1])
        for chunk in scores:
            assert chunk.binary and len(chunk.units) == PER_CHUNK and set(chunk.scores) <= {0.0, 1.0}
            for row, wrong in zip(chunk.units, chunk.scores, strict=True):
                item = items.items[row]
                prompt = list(item.prompt.encode())
                sums = []
                for choice in item.choices:
                    ids = torch.tensor([prompt + list(choice.encode())])
                    with torch.no_grad():
                        logp = torch.log_softmax(unrolled[name](input_ids=ids[:, :-1]).logits.float(), -1)
                    targets = ids[0, len(prompt) :]
                    sums.append(logp[0, len(prompt) - 1 :].gather(1, targets[:, None]).sum().item())
                assert wrong == float(max(range(len(sums)), key=sums.__getitem__) != item.correct), (name, row, sums)


def test_exact_decoding_is_transformers_greedy_decoding(recurrent_checkpoint, model, unrolled, tmp_path):
    """Items whose answers are what the plain model decodes greedily (transformers' generate): the plain schedule
    gets every one right, and the recurrent schedule gets right exactly those where its own greedy text agrees."""
    cfg, _ = model
    lines = code_lines(2 * PER_CHUNK, seed=3)
    rows = []
    for line in lines:
        ids = torch.tensor([list(line[:24].encode())])
        with torch.no_grad():
            new = unrolled["plain"].generate(ids, max_new_tokens=4, do_sample=False)[0, ids.shape[1] :]
        rows.append({"q": line[:24], "a": bytes(new.tolist()).decode("utf-8", errors="replace")})
    path = tmp_path / "exact.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    task = ItemTask(
        "exact",
        load_items(str(path), ItemColumns("q", "a")),
        tokenizer(recurrent_checkpoint),
        stop="",
        max_new_tokens=4,
    )
    plain = chunk_scores(cfg, [0, 1, 2, 3], task, frozen_cfg(), [0, 1])
    assert all(s == 0.0 for c in plain for s in c.scores), [c.scores for c in plain]
    recurrent = chunk_scores(cfg, RECURRENT, task, frozen_cfg(), [0, 1])
    for chunk in recurrent:
        for row, wrong in zip(chunk.units, chunk.scores, strict=True):
            ids = torch.tensor([list(rows[row]["q"].encode())])
            with torch.no_grad():
                new = unrolled["recurrent"].generate(ids, max_new_tokens=4, do_sample=False)[0, ids.shape[1] :]
            own = bytes(new.tolist()).decode("utf-8", errors="replace")
            assert wrong == float(own.strip().casefold() != rows[row]["a"].strip().casefold())


def write_answer_items(path: Path, n: int = 96) -> Path:
    """Prompt/answer rows: a line's first 24 characters and its next 12, a few hundred bytes in all (fewer than one
    held-out window of the text)."""
    rows = [{"prompt": line[:24], "answer": line[24:36]} for line in code_lines(n, seed=7)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def test_answer_scores_are_each_items_answer_loss_on_the_transformers_model(
    recurrent_checkpoint, model, unrolled, tmp_path
):
    """A frozen `answer` item's score is the mean loss of its answer's tokens after its prompt: computed here item by
    item with transformers, for two schedules; the chunk's loss is its nats over its tokens."""
    cfg, _ = model
    items = load_items(str(write_answer_items(tmp_path / "answers.jsonl")), ItemColumns("prompt", "answer"))
    task = ItemTask("answer", items, tokenizer(recurrent_checkpoint))
    for name, schedule in (("plain", [0, 1, 2, 3]), ("recurrent", RECURRENT)):
        for chunk in chunk_scores(cfg, schedule, task, frozen_cfg(), [0, 1]):
            assert not chunk.binary and len(chunk.units) == PER_CHUNK
            assert chunk.tokens == sum(chunk.counts) >= 12 * PER_CHUNK
            for row, loss, counted in zip(chunk.units, chunk.scores, chunk.counts, strict=True):
                item = items.items[row]
                context = item.prompt.rstrip()  # as lm-eval pairs them: the prompt's end spaces begin the answer
                prompt, answer = list(context.encode()), list((item.prompt[len(context) :] + item.answer).encode())
                assert counted == len(answer)
                ids = torch.tensor([prompt + answer])
                with torch.no_grad():
                    logits = unrolled[name](input_ids=ids[:, :-1]).logits.float()
                own = torch.nn.functional.cross_entropy(logits[0, len(prompt) - 1 :], ids[0, len(prompt) :])
                assert loss == pytest.approx(own.item(), abs=1e-4), (name, row)
            assert chunk.val_loss == pytest.approx(chunk.nats / chunk.tokens)


@pytest.mark.slow
def test_a_frozen_answer_study_races_by_item_and_says_answer_loss(cli, tmp_path, recurrent_checkpoint):
    """Answer rows far fewer than one held-out window of text are scored item by item: the race pairs by item and
    says "answer loss" and "item chunk", never perplexity or windows."""
    items = write_answer_items(tmp_path / "answers.jsonl")
    proc, db = choice_run(cli, tmp_path, recurrent_checkpoint, items, objective="answer")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    by_map = {c["map"]: c for c in summary["race"]["comparisons"]}
    assert "2,2,1,1" in by_map, by_map
    for comparison in by_map.values():
        assert comparison["units"] == PER_CHUNK * len(comparison["seeds"]) and set(comparison["seeds"]) <= {1, 2, 3, 4}
    words = " ".join([summary["answer"], *summary["answer_details"], summary["verdict"]])
    assert "answer loss" in words and "item chunk" in words, words
    for wrong in ("ppl", "perplexity", "seed", "window", "accuracy"):
        assert wrong not in words, (wrong, words)
    with sqlite3.connect(db) as conn:
        stored = [json.loads(s) for (s,) in conn.execute("select scores from ilr_runs where scores is not null")]
    assert stored and all(len(s) == PER_CHUNK for s in stored)
    assert any(v not in (0.0, 1.0) for s in stored for v in s)  # losses in nats, not 0/1


def test_the_shared_prefix_gives_the_full_forward_passs_scores_exactly(
    recurrent_checkpoint, model, token_cache, tmp_path
):
    """A map that begins as the plain model (block:2-3:2 after layer 3; 1,1,2,1 before its third layer) starts from
    the plain model's kept states: the same operations on the same batches, so the same numbers to the last bit."""
    from ilr_search.config import DataConfig
    from ilr_search.data.tokens import load_tokens
    from ilr_search.training.frozen import frozen_evaluator

    cfg, _ = model
    windows = load_tokens(DataConfig(tokenizer=f"file:{recurrent_checkpoint / 'tokenizer.json'}"), seq_len=SEQ)
    items = ItemTask(
        "choice",
        load_items(str(write_choice_items(tmp_path / "items.jsonl")), ItemColumns("prompt", "answer", "choices")),
        tokenizer(recurrent_checkpoint),
    )
    for data in (windows, items):
        evaluator = frozen_evaluator(cfg, data, frozen_cfg())
        evaluator.evaluate(cfg, [0, 1, 2, 3], 1, PER_CHUNK)  # the plain model keeps its states
        for schedule in ([0, 1, 2, 3, 2, 3], [0, 1, 2, 2, 3], [0, 1, 2, 3]):
            shared = evaluator.evaluate(cfg, schedule, 1, PER_CHUNK, share=True)
            full = evaluator.evaluate(cfg, schedule, 1, PER_CHUNK, share=False)
            assert shared.scores == full.scores and shared.nats == full.nats
        assert evaluator.cached_bytes > 0


def test_bf16_scores_differ_from_fp32_within_a_stated_tolerance(recurrent_checkpoint, model, token_cache):
    """bf16 weights (stored, not autocast) change each window's loss by less than 0.05 nats here, and the chunk's by
    less than 0.01; the order of two maps that differ by far more is unchanged."""
    import dataclasses

    from ilr_search.config import DataConfig
    from ilr_search.data.tokens import load_tokens

    cfg, _ = model
    data = load_tokens(DataConfig(tokenizer=f"file:{recurrent_checkpoint / 'tokenizer.json'}"), seq_len=SEQ)
    fp32 = {tuple(s): chunk_scores(cfg, s, data, frozen_cfg(), [1])[0] for s in ([0, 1, 2, 3], RECURRENT)}
    bf16_cfg = dataclasses.replace(frozen_cfg(), dtype="bf16")
    bf16 = {tuple(s): chunk_scores(cfg, s, data, bf16_cfg, [1])[0] for s in ([0, 1, 2, 3], RECURRENT)}
    for key in fp32:
        assert max(abs(a - b) for a, b in zip(fp32[key].scores, bf16[key].scores, strict=True)) < 0.05
        assert abs(fp32[key].val_loss - bf16[key].val_loss) < 0.01
    assert (fp32[(0, 1, 2, 3)].val_loss > fp32[tuple(RECURRENT)].val_loss) == (
        bf16[(0, 1, 2, 3)].val_loss > bf16[tuple(RECURRENT)].val_loss
    )


def choice_run(cli, tmp_path: Path, checkpoint: Path, items: Path, *extra: str, objective: str = "choice"):
    space = write_space(
        tmp_path / "items.toml",
        search={
            "noise_seeds": 0,
            "families": ["ilr"],
            "max_reuse": 2,
            "n_trials": 2,
            "race_seeds": 3,
            "max_seeds": 5,
            "race_contenders": 3,
            "enqueue_paper_maps": False,
        },
        train={"eval_windows": PER_CHUNK},
    )
    db = tmp_path / "items.db"
    return cli(
        *frozen_run_args(space, checkpoint, "1.5x", f"sqlite:///{db}"),
        "--objective",
        objective,
        "--data",
        str(items),
        "--text-column",
        "prompt",
        "--answer-column",
        "answer",
        *(["--choices-column", "choices"] if objective == "choice" else []),
        "--enqueue",
        "2,2,1,1",
        "--json",
        *extra,
    ), db


@pytest.mark.slow
def test_a_frozen_choice_study_races_by_item_and_says_accuracy(cli, tmp_path, recurrent_checkpoint):
    items = write_choice_items(tmp_path / "items.jsonl", n=96)
    proc, db = choice_run(cli, tmp_path, recurrent_checkpoint, items)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    race = summary["race"]
    assert race["frozen"] and summary["equal_compute"] is None
    by_map = {c["map"]: c for c in race["comparisons"]}
    assert "2,2,1,1" in by_map and len(by_map) == 2, by_map
    for comparison in by_map.values():  # paired by item over the chunks the trials never saw
        assert comparison["units"] == PER_CHUNK * len(comparison["seeds"]) and set(comparison["seeds"]) <= {1, 2, 3, 4}
    answer = summary["answer"]
    words = " ".join([answer, *summary["answer_details"], summary["verdict"]])
    assert "accuracy" in answer and "item chunk" in words, answer
    for wrong in ("ppl", "perplexity", "seed", "0 steps", "window"):
        assert wrong not in words, (wrong, words)
    # every race run keeps its items' scores, one a row of the chunk, 0 or 1
    with sqlite3.connect(db) as conn:
        stored = [json.loads(s) for (s,) in conn.execute("select scores from ilr_runs where scores is not null")]
    assert stored and all(len(s) == PER_CHUNK and set(s) <= {0.0, 1.0} for s in stored)


@pytest.mark.parametrize(
    "change,words",
    [
        ({"--choices-column": "options"}, "no column 'options'"),
        ({"--answer-column": "label"}, "no column 'label'"),
    ],
)
def test_an_item_file_without_the_named_columns_is_one_error_line(cli, tmp_path, recurrent_checkpoint, change, words):
    items = write_choice_items(tmp_path / "items.jsonl", n=96)
    space = write_space(
        tmp_path / "items.toml",
        search={"noise_seeds": 0, "families": ["ilr"], "n_trials": 2},
        train={"eval_windows": PER_CHUNK},
    )
    args = {"--text-column": "prompt", "--answer-column": "answer", "--choices-column": "choices", **change}
    db = tmp_path / "bad.db"
    proc = cli(
        *frozen_run_args(space, recurrent_checkpoint, "1.5x", f"sqlite:///{db}"),
        "--objective",
        "choice",
        "--data",
        str(items),
        *[x for kv in args.items() for x in kv],
    )
    assert_one_line_error(proc)
    assert words in proc.stderr and not db.exists()


def test_task_items_need_a_frozen_pretrained_model(cli, tmp_path):
    items = write_choice_items(tmp_path / "items.jsonl", n=32)
    proc = cli(
        "run",
        "--space",
        str(write_space(tmp_path / "s.toml")),
        "--budget",
        "1.5x",
        "--objective",
        "choice",
        "--data",
        str(items),
        "--text-column",
        "prompt",
        "--answer-column",
        "answer",
        "--choices-column",
        "choices",
        "--storage",
        f"sqlite:///{tmp_path / 'x.db'}",
    )
    assert_one_line_error(proc)
    assert "--init" in proc.stderr and not (tmp_path / "x.db").exists()
