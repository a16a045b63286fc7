"""`run --learn` (issue 55): gates on every extra pass of one model at the widest schedule, ordered sigmoids held
within the budget by a projection whose target falls from the widest schedule's FLOPs, the map read off them
trained and raced as a trial. Real models, no mocks: the gates' two ends are the widest map and the plain model
exactly; frozen on the checkpoint trained with 2,2,1,1 they read off 2,2,1,1; the projection holds the expected FLOPs
within a budget that binds; bad input is one error line; and a run with no other trial stores the learned map as a
trial and answers about it."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import TINY_SPACE, TRAINED_MAP, assert_one_line_error, frozen_run_args, write_space

from ilr_search.commands.api import with_init
from ilr_search.config import ModelConfig
from ilr_search.search.plan import plan_study
from ilr_search.space import load_space
from ilr_search.training.build import build_model
from ilr_search.training.frozen import load_space_data
from ilr_search.training.learned import LearnedGates, gated_loss, learn_gates, widest_schedule

# frozen and trained studies that race, as on one core: no race worker processes (conftest.one_core)
pytestmark = pytest.mark.usefixtures("one_usable_core")


def test_open_gates_are_the_widest_map_and_shut_gates_the_plain_model():
    cfg = ModelConfig(vocab_size=256, n_layers=4, d_model=32, n_heads=2, seq_len=64, max_reuse=3)
    model = build_model(cfg, 0)
    x, y = torch.randint(0, 256, (2, 2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        widest = model.loss(x, y, widest_schedule(4, 3))
        plain = model.loss(x, y, [0, 1, 2, 3])
        assert torch.equal(gated_loss(model, x, y, torch.ones(4, 2)), widest)
        assert torch.equal(gated_loss(model, x, y, torch.zeros(4, 2)), plain)
        assert not torch.equal(widest, plain)


def test_the_read_off_keeps_gates_at_one_half_and_fits_the_budget():
    learned = LearnedGates(((0.9, 0.6), (0.7, 0.2), (0.4, 0.1), (0.5, 0.49)), 1.6, 1.5, 0.1, 10, 1.0, False)
    assert learned.counts(max_layer_runs=9) == (3, 2, 1, 2)
    assert learned.counts(max_layer_runs=6) == (2, 2, 1, 1)  # the lowest-gated kept passes go first
    assert learned.counts(max_layer_runs=4) == (1, 1, 1, 1)
    assert learned.kept_gates((3, 2, 1, 2)) == [0.9, 0.6, 0.7, 0.5]


def frozen_gates(checkpoint, budget: str) -> tuple[LearnedGates, int]:
    """Gates learned frozen on the checkpoint (32 select windows), and the budget's most layer runs."""
    space = with_init(load_space(TINY_SPACE, {"train": {"steps": 0, "eval_windows": 32}}), str(checkpoint))
    plan = plan_study(space, budget, None)
    train = dataclasses.replace(space.train, dtype="fp32")
    learned = learn_gates(plan.trial_model({}), load_space_data(space), train, plan.budget.ratio, 3)
    return learned, plan.budget.max_layer_runs(plan.model)


def test_frozen_gates_read_off_the_map_the_checkpoint_was_trained_with(recurrent_checkpoint):
    learned, max_runs = frozen_gates(recurrent_checkpoint, "1.5x")
    assert learned.frozen and learned.steps > 0
    assert learned.counts(max_runs) == tuple(TRAINED_MAP), learned.gates
    assert learned.expected_ratio <= learned.budget_ratio


def test_the_projection_holds_the_expected_flops_within_a_budget_that_binds(recurrent_checkpoint):
    # 1.25x pays for one extra pass; the checkpoint's loss wants two: the budget has to act
    learned, max_runs = frozen_gates(recurrent_checkpoint, "1.25x")
    assert learned.shift > 0
    assert learned.expected_ratio <= learned.budget_ratio, learned
    assert sum(learned.counts(max_runs)) <= max_runs


@pytest.mark.parametrize(
    "search, flags, words",
    [
        ({"families": ["blocks"]}, [], "family ilr"),
        ({}, ["--sampler", "grid"], "grid"),
        ({}, ["--n-trials", "-1"], "--n-trials"),
    ],
)
def test_learn_refuses_what_it_cannot_serve_in_one_line(cli, tmp_path, search, flags, words):
    space = write_space(tmp_path / "space.toml", search=search)
    db = tmp_path / "s.db"
    proc = cli("run", "--space", str(space), "--budget", "1.5x", "--storage", f"sqlite:///{db}", "--learn", *flags)
    assert_one_line_error(proc)
    assert words in proc.stderr
    assert not db.exists()


def test_learn_refuses_task_items_in_one_line(cli, tmp_path, recurrent_checkpoint):
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"q": f"{i}+1=", "a": str(i + 1)}) + "\n" for i in range(40)))
    space = write_space(tmp_path / "space.toml", search={"families": ["ilr"]})
    db = tmp_path / "s.db"
    args = frozen_run_args(space, recurrent_checkpoint, "1.5x", f"sqlite:///{db}")
    proc = cli(
        *args, "--learn", "--objective", "exact", "--data", str(items), "--text-column", "q", "--answer-column", "a"
    )
    assert_one_line_error(proc)
    assert "task items" in proc.stderr
    assert not db.exists()


@pytest.mark.slow
def test_learn_with_no_other_trial_trains_and_races_the_learned_map(cli, tmp_path):
    space = write_space(
        tmp_path / "space.toml",
        search={"noise_seeds": 0, "families": ["ilr"], "race_seeds": 2, "equal_compute": "off"},
    )
    url = f"sqlite:///{tmp_path / 's.db'}"
    args = ("run", "--space", str(space), "--budget", "1.5x", "--storage", url, "--study", "learned", "--learn")
    # the dry run counts the learning run (the widest schedule: 4 layers x max_reuse 3) and the learned map's trial
    plan = json.loads(cli(*args, "--n-trials", "0", "--dry-run", "--json", check=True).stdout)
    assert plan["learn"] == {"layer_runs": 12, "steps": 24, "frozen": False, "learned": False}
    assert plan["trials_to_train"] == 2 and plan["estimated_learn_seconds"] > 0
    assert not (tmp_path / "s.db").exists()
    proc = cli(*args, "--n-trials", "0", "--json", check=True)
    report = json.loads(proc.stdout)
    learned = report["learned"]
    assert len(learned["gates"]) == 4 and all(len(row) == 2 for row in learned["gates"])
    assert learned["steps"] == 24 and learned["seconds"] > 0 and not learned["frozen"]
    trials = json.loads(cli("trials", "--study", "learned", "--storage", url, "--json", check=True).stdout)
    maps = {
        t["reuse_map"] if isinstance(t["reuse_map"], str) else ",".join(map(str, t["reuse_map"]))
        for t in trials["trials"]
    }
    assert learned["map"] in maps and learned["trial"] is not None
    assert trials["learned"]["map"] == learned["map"]
    answer = report["answer"]
    assert answer.startswith("no map beat") or answer.startswith(f"use {learned['map']}"), answer
    # the human forms show the gates, the learned map and what learning cost
    text = cli(*args, "--n-trials", "0", check=True).stdout
    assert "learned gates" in text and f"learned map {learned['map']}" in text
    assert "learned gates" in cli("trials", "--study", "learned", "--storage", url, check=True).stdout
    plan = json.loads(cli(*args, "--n-trials", "0", "--dry-run", "--json", check=True).stdout)
    assert plan["learn"]["learned"] and plan["trials_to_train"] == 0
