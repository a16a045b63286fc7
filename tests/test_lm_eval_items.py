"""lm-eval tasks scored per item in process (training/lm_eval_items.py), with real lm-eval: a local task YAML over a
JSON-lines file of multiple-choice items that the test writes, a tiny in-package model (random weights, made
decisive) unrolled in memory, and the byte tokenizer of a checkpoint folder the test writes. Scores are checked
against lm-eval's multiple-choice rule computed here by hand on the same transformers model."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT

from ilr_search.config import ModelConfig
from ilr_search.data.tokenizers import byte_tokenizer_model
from ilr_search.training.build import build_model

pytest.importorskip("lm_eval")
transformers = pytest.importorskip("transformers")

from ilr_search.training.lm_eval_items import (  # noqa: E402  # after the skips: lm-eval is an optional extra
    TaskError,
    TaskInfo,
    check_task,
    lm_eval_scores,
    unrolled_hf_model,
)
from ilr_search.training.pretrained import export_checkpoint  # noqa: E402

SCHEDULE = [0, 1, 1, 2, 3]  # layer 1 run twice
TASK = "toy_choice"


def items() -> list[dict]:
    """12 sums of one digit or two, each with 4 choices of one digit or two (so that the summed and the
    length-normalised rules differ), the right one at a different place from item to item."""
    rows = []
    for i in range(12):
        a, b = 1 + i % 5, 2 + (i * 7) % 9
        choices = [str(c) for c in (a + b + 1, a + b + 2, a + b - 1)]
        choices.insert(i % 4, str(a + b))
        rows.append({"question": f"{a}+{b}=", "choices": choices, "label": i % 4})
    return rows


def context(row: dict) -> str:
    return f"Q: {row['question']}\nA:"  # the YAML's doc_to_text


def write_task(folder, data_file, name: str = TASK, cache=None, **fields) -> None:
    """A task YAML in `folder` over `data_file` (the multiple-choice task; `fields` replace its keys)."""
    config = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_file)}, **({"cache_dir": str(cache)} if cache else {})},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": "Q: {{question}}\nA:",
        "doc_to_choice": "{{choices}}",
        "doc_to_target": "label",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        **fields,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(json.dumps(config, indent=1), encoding="utf-8")  # JSON is YAML


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(model, checkpoint folder with the byte tokenizer, tasks folder): a 4-layer model whose initial weights get
    noise of std 0.1 (every one, norm gains too), so that its choices differ clearly in log-likelihood."""
    root = tmp_path_factory.mktemp("lm-eval")
    data = root / "items.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in items()), encoding="utf-8")
    tasks = root / "tasks"
    write_task(tasks, data, cache=root / "datasets-cache")
    model = build_model(ModelConfig(n_layers=4, d_model=32, n_heads=4, seq_len=64), seed=3).eval()
    torch.manual_seed(11)  # a draw under which the model gets some items right, and the two rules differ
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    checkpoint = export_checkpoint(model, [0, 1, 2, 3], root / "checkpoint")  # for its tokenizer folder
    return model, checkpoint, tasks


def scores(tiny, doc_ids, **kwargs):
    model, checkpoint, tasks = tiny
    return lm_eval_scores(model, SCHEDULE, checkpoint, "llama", TASK, tasks, doc_ids, **kwargs)


@pytest.fixture(scope="module")
def all_scores(tiny):
    return scores(tiny, range(12))


def test_a_local_task_is_found_with_its_documents_and_metric(tiny):
    assert check_task(TASK, tiny[2]) == TaskInfo(TASK, 12, "acc", binary=True, higher_is_better=True)


def test_each_requested_document_gets_one_score_of_0_or_1(all_scores):
    result = all_scores
    assert (result.task, result.metric, result.binary, result.higher_is_better) == (TASK, "acc", True, True)
    assert result.doc_ids == tuple(range(12)) and len(result.scores) == 12
    assert set(result.scores) <= {0.0, 1.0}


def test_scores_follow_the_order_of_the_ids_asked(tiny, all_scores):
    """Ids out of order, and one asked twice, each get their own document's score."""
    ids = [11, 4, 0, 4, 7]
    result = scores(tiny, ids, batch_size=2)
    assert result.doc_ids == tuple(ids)
    assert result.scores == tuple(all_scores.scores[i] for i in ids)


def test_the_same_documents_give_the_same_scores(tiny, all_scores):
    assert scores(tiny, range(12)) == all_scores


def test_two_chunks_score_as_the_whole(tiny, all_scores):
    first, second = scores(tiny, range(6)), scores(tiny, range(6, 12))
    assert first.scores + second.scores == all_scores.scores


def argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)  # the first of equal values, as numpy's


def test_acc_is_the_argmax_of_the_summed_choice_log_likelihoods(tiny, all_scores):
    """lm-eval's multiple-choice acc, computed here on the unrolled transformers model: the choice whose
    continuation ' CHOICE' has the highest summed log-probability given the context, not divided by the choice's
    length (that is acc_norm)."""
    model, _, _ = tiny
    hf_model = unrolled_hf_model(model, SCHEDULE, "llama")
    summed, normalised = [], []
    for row in items():
        ctx = context(row).encode()
        lls = []
        for choice in row["choices"]:
            ids = torch.tensor([list(ctx + f" {choice}".encode())])
            with torch.no_grad():
                logp = torch.log_softmax(hf_model(input_ids=ids[:, :-1]).logits[0], dim=-1)
            targets = ids[0, len(ctx) :]
            lls.append(logp[len(ctx) - 1 :, :].gather(1, targets[:, None]).sum().item())
        per_char = [ll / len(choice) for ll, choice in zip(lls, row["choices"], strict=True)]
        summed.append(1.0 if argmax(lls) == row["label"] else 0.0)
        normalised.append(1.0 if argmax(per_char) == row["label"] else 0.0)
    assert all_scores.scores == tuple(summed)
    assert 0 < sum(summed) < 12  # the model gets some right and some wrong: agreement says something
    assert tuple(normalised) != tuple(summed)  # and the check tells the two rules apart


GENERATE = {
    "output_type": "generate_until",
    "doc_to_choice": None,
    "doc_to_target": "{{answer}}",
    "generation_kwargs": {"until": ["\n"], "max_gen_toks": 3, "do_sample": False},
    "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
}


def test_a_generation_task_scores_greedy_answers_by_exact_match(tiny, tmp_path):
    """exact_match of lm-eval's greedy generation (3 tokens, up to a newline) against answers that are the
    unrolled model's own greedy continuations (generated here with transformers) on even documents, and never on
    odd ones. Generating needs an end-of-sequence token: byte 0 is given that role in a tokenizer of its own."""
    model, _, _ = tiny
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=byte_tokenizer_model(), eos_token=chr(256))
    tokenizer.save_pretrained(tmp_path / "tokenizer")  # chr(256): byte 0's byte-level symbol
    hf_model = unrolled_hf_model(model, SCHEDULE, "llama")
    rows = []
    for i, row in enumerate(items()):
        ids = torch.tensor([list(context(row).encode())])
        new = hf_model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)[0, ids.shape[1] :]
        answer = tokenizer.decode(new.tolist(), skip_special_tokens=True).split("\n")[0]
        rows.append({"question": row["question"], "answer": answer if i % 2 == 0 else answer + "!"})
    data = tmp_path / "answers.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    write_task(tmp_path / "tasks", data, name="toy_generate", cache=tmp_path / "cache", **GENERATE)
    assert check_task("toy_generate", tmp_path / "tasks") == TaskInfo("toy_generate", 12, "exact_match", True, True)
    result = lm_eval_scores(
        model, SCHEDULE, tmp_path / "tokenizer", "llama", "toy_generate", tmp_path / "tasks", range(12)
    )
    assert result.scores == tuple(1.0 if i % 2 == 0 else 0.0 for i in range(12))
    with pytest.raises(TaskError) as e:  # the byte tokenizer of the checkpoint has no end-of-sequence token
        lm_eval_scores(model, SCHEDULE, tiny[1], "llama", "toy_generate", tmp_path / "tasks", [0])
    assert_one_line(e, "end-of-sequence token")


def test_the_unrolled_model_gives_the_schedules_logits(tiny):
    model, _, _ = tiny
    hf_model = unrolled_hf_model(model, SCHEDULE, "llama")
    assert hf_model.config.num_hidden_layers == 5 and not hf_model.training
    assert next(hf_model.parameters()).dtype == torch.float32
    x = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = hf_model(input_ids=x).logits
        torch.testing.assert_close(logits, model(x, SCHEDULE), atol=1e-4, rtol=1e-4)
        assert not torch.allclose(logits, model(x), atol=1e-3)  # the repeat changes the model


def test_scoring_prints_nothing_on_stdout_and_writes_nothing(tiny, tmp_path, monkeypatch, capfd):
    _, checkpoint, tasks = tiny
    before = sorted(p.relative_to(tasks.parent) for p in tasks.parent.rglob("*") if "datasets-cache" not in p.parts)
    work = tmp_path / "project"
    work.mkdir()
    monkeypatch.chdir(work)
    result = scores(tiny, [2, 9])
    assert len(result.scores) == 2
    assert capfd.readouterr().out == ""
    assert list(work.iterdir()) == []
    after = sorted(p.relative_to(tasks.parent) for p in tasks.parent.rglob("*") if "datasets-cache" not in p.parts)
    assert after == before and (checkpoint / "config.json").is_file()


def assert_one_line(e: pytest.ExceptionInfo, *words: str) -> None:
    message = str(e.value)
    assert "\n" not in message and message.strip() == message, message
    for word in words:
        assert word in message, message


def test_an_unknown_local_task_is_one_line(tiny):
    with pytest.raises(TaskError) as e:
        check_task("toy_choise", tiny[2])
    assert_one_line(e, "unknown lm-eval task 'toy_choise'", "did you mean toy_choice")


def test_a_task_whose_data_file_is_missing_is_one_line(tmp_path):
    write_task(tmp_path / "tasks", tmp_path / "absent.jsonl", name="gone")
    with pytest.raises(TaskError) as e:
        check_task("gone", tmp_path / "tasks")
    assert_one_line(e, "lm-eval task gone: cannot load its data", "absent.jsonl")


def test_a_missing_tasks_folder_is_one_line(tmp_path):
    with pytest.raises(TaskError) as e:
        check_task(TASK, tmp_path / "nowhere")
    assert_one_line(e, "no such folder")


def test_a_task_that_cannot_be_scored_per_item_is_one_line(tmp_path):
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in items()), encoding="utf-8")
    write_task(
        tmp_path / "tasks",
        data,
        name="rolling",
        cache=tmp_path / "cache",
        output_type="loglikelihood_rolling",
        doc_to_target="{{question}}",
        metric_list=[{"metric": "word_perplexity"}],
    )
    with pytest.raises(TaskError) as e:
        check_task("rolling", tmp_path / "tasks")
    assert_one_line(e, "loglikelihood_rolling cannot be scored per item")


@pytest.mark.parametrize("case", ["function", "included function", "hub metric"])
def test_a_local_task_that_names_code_is_refused_before_it_is_loaded(tmp_path, case):
    """A task folder is data: no Python module (a `!function` would import utils.py), also in a file it includes
    from elsewhere, no metric fetched from the hub. The refusal comes before lm-eval reads the task: the
    module's marker file is never written."""
    folder, shared = tmp_path / "tasks", tmp_path / "shared"
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in items()), encoding="utf-8")
    write_task(folder, data, name="coded", cache=tmp_path / "cache")
    shared.mkdir()
    for where in (folder, shared):
        (where / "utils.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\ndef docs(d): return d\n")
    text = (folder / "coded.yaml").read_text(encoding="utf-8")
    function = ',\n "process_docs": !function utils.docs\n}\n'
    if case == "function":
        text = text.rstrip().rstrip("}") + function
    elif case == "included function":
        (shared / "base.yaml").write_text("{" + function.lstrip(","), encoding="utf-8")
        text = text.rstrip().rstrip("}") + ',\n "include": "../shared/base.yaml"\n}\n'
    else:
        text = text.replace('"metric": "acc"', '"metric": "rouge"')
    (folder / "coded.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(TaskError) as e:
        check_task("coded", folder)
    assert_one_line(e, "metric 'rouge'" if case == "hub metric" else "!function utils.docs")
    assert ("base.yaml" in str(e.value)) == (case == "included function")
    assert not (tmp_path / "ran").exists()


def test_documents_outside_the_task_are_one_line(tiny):
    with pytest.raises(TaskError) as e:
        scores(tiny, [3, 12])
    assert_one_line(e, "no document 12", "0..11")


def test_without_lm_eval_the_error_says_how_to_install_it(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # what `import lm_eval` finds where it is not installed
    with pytest.raises(TaskError) as e:
        check_task(TASK, tiny[2])
    assert_one_line(e, "lm-eval tasks need lm-eval; pip install 'ilr-search[eval]'")


def test_no_documents_score_nothing(tiny):
    result = scores(tiny, [])
    assert (result.doc_ids, result.scores, result.metric) == ((), (), "acc")


REGISTRY_CHECKS = """
import json
from ilr_search.training.lm_eval_items import TaskError, check_task
out = {}
for task in ("hellaswag", "hellaswagg"):
    try:
        check_task(task, None)
        out[task] = None
    except TaskError as e:
        out[task] = str(e)
print(json.dumps(out))
"""


def test_registry_tasks_offline_uncached_or_unknown_are_one_line(tmp_path):
    """lm-eval's registry, offline, in a process whose Hugging Face caches are empty folders of its own (so that
    hellaswag's data is surely not cached), from an empty working folder that stays empty."""
    work, hf_home = tmp_path / "project", tmp_path / "hf-home"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env |= {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", REGISTRY_CHECKS], cwd=work, env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    messages = json.loads(proc.stdout.strip().splitlines()[-1])
    offline, unknown = messages["hellaswag"], messages["hellaswagg"]
    assert offline and "\n" not in offline and "not cached" in offline and "download it first" in offline, offline
    assert unknown and "\n" not in unknown and "unknown lm-eval task 'hellaswagg'" in unknown, unknown
    assert "did you mean hellaswag" in unknown, unknown
    assert list(work.iterdir()) == []
