"""How race workers share a wave: the groups that train together are formed from the runs alone (so a run's
rounding never depends on which worker claimed first), and a waiting worker wakes when a run lands."""

import time
from pathlib import Path

from ilr_search.config import ModelConfig, TrainConfig
from ilr_search.search.race import RaceRunPlan, fused_groups, held_runs, wait_for_change
from ilr_search.storage import Run, RunJob, grace_period

PLAIN = ModelConfig()
DEEPER = ModelConfig(n_layers=12)


def run(name: str, seed: int, steps: int = 100, model: ModelConfig = PLAIN) -> RaceRunPlan:
    job = RunJob("2", seed, name)
    return RaceRunPlan(
        job, [1] * model.n_layers, model, TrainConfig(steps=steps, seed=seed), Path(f"{name}-{seed}.pt"), 0
    )


def names(groups: list[list[RaceRunPlan]]) -> list[list[str]]:
    return [[f"{r.job.map_key}@{r.job.seed}" for r in g] for g in groups]


def test_groups_take_runs_of_one_length_and_model_in_order_up_to_the_limit():
    runs = [
        run("a", 1),
        run("deep", 1, model=DEEPER),
        run("b", 1),
        run("c", 1),
        run("deep", 2, model=DEEPER),
        run("a", 2, steps=200),
        run("b", 2),
    ]
    assert names(fused_groups(runs, 2)) == [["a@1", "b@1"], ["deep@1", "deep@2"], ["c@1"], ["a@2"], ["b@2"]]
    assert names(fused_groups(runs, 3)) == [["a@1", "b@1", "c@1"], ["deep@1", "deep@2"], ["a@2"], ["b@2"]]
    assert names(fused_groups(runs, 1)) == [[f"{r.job.map_key}@{r.job.seed}"] for r in runs]


def test_a_model_the_fused_trainer_cannot_take_trains_alone():
    lr_scaled = ModelConfig(repeat_scale="lr")  # check_fusable refuses it
    runs = [run("g", 1, model=lr_scaled), run("g", 2, model=lr_scaled), run("a", 1)]
    assert names(fused_groups(runs, 4)) == [["g@1"], ["g@2"], ["a@1"]]


def test_only_live_runs_of_other_workers_are_held():
    now = time.time()
    rows = [
        Run("race", "mine", "2", 1, "running", 1.0, 100, "me", now),
        Run("race", "theirs", "2", 1, "running", 1.0, 100, "other", now),
        Run("race", "dead", "2", 1, "running", 1.0, 100, "other", now - grace_period() - 5),
        Run("race", "done", "2", 1, "complete", 1.0, 100, "other", now),
    ]
    assert held_runs(rows, "me") == {RunJob("2", 1, "theirs")}


def test_a_waiting_worker_wakes_at_the_first_look_that_differs():
    looks = []

    def look() -> int:  # the runs as a worker sees them: a run lands between its second and third look
        looks.append(None)
        return len(looks) >= 3

    wait_for_change(look, 3600.0)
    assert len(looks) == 3  # it returned at the change, long before its hour
    start = time.monotonic()
    wait_for_change(lambda: 0, 0.5)  # nothing changes: it waits out its limit
    assert time.monotonic() - start >= 0.5
