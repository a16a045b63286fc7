"""Lanes (training/jobs.py): jobs trained in threads side by side give the numbers of their groups trained one after
another, whatever the timing; each evaluation callback sees the points it would see then; a stop (pruning), a
failure and Ctrl-C end every lane.

Real tiny models at lr 1e-2, where a rounding difference would grow to a visible one within these 40 steps: the
comparisons are exact."""

import signal
import threading
from dataclasses import replace

import pytest
import torch

from ilr_search.config import DataConfig, ModelConfig, TrainConfig
from ilr_search.data.tokens import load_tokens
from ilr_search.training.jobs import Job, lane_units, train_jobs

MODEL = ModelConfig(vocab_size=256, n_layers=3, d_model=16, n_heads=2, seq_len=32)
TRAIN = TrainConfig(
    steps=40,
    batch_size=4,
    lr=1e-2,
    eval_fractions=(0.25, 0.5, 1.0),
    eval_windows=8,
    dtype="fp32",
    device="cpu",
    checkpoint_every=0,
)
SCHEDULES = [[0, 1, 2], [0, 0, 1, 2], [0, 1, 1, 2, 2], [0, 0, 1, 1, 2]]


@pytest.fixture(scope="module")
def data(token_cache):
    return load_tokens(DataConfig(), root=token_cache)


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def jobs(on_eval=lambda i: None) -> list[Job]:
    return [Job(MODEL, s, replace(TRAIN, seed=i), on_eval=on_eval(i)) for i, s in enumerate(SCHEDULES)]


def lanes_alive() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("lane-")]


def test_lane_units_split_the_largest_group_until_every_lane_has_one():
    assert lane_units([[0, 1, 2, 3]], 2) == [[0, 1], [2, 3]]
    assert lane_units([[0, 1, 2]], 2) == [[0, 1], [2]]
    assert lane_units([[0, 1, 2, 3], [4]], 4) == [[0], [1], [2, 3], [4]]
    assert lane_units([[0], [1], [2]], 2) == [[0], [1], [2]]
    assert lane_units([[0]], 2) == [[0]]
    assert lane_units([], 2) == []
    assert lane_units([[0, 1, 2, 3]], 1) == [[0, 1, 2, 3]]


def test_lanes_give_the_numbers_of_their_groups_trained_one_after_another(data):
    one_after_another = train_jobs(jobs()[:2], data, fuse=2) + train_jobs(jobs()[2:], data, fuse=2)
    for _ in range(2):  # two runs, two timings
        in_lanes = train_jobs(jobs(), data, fuse=4, lanes=2)
        assert [(r.status, r.steps, r.val_loss, r.curve, r.batch_digest) for r in in_lanes] == [
            (r.status, r.steps, r.val_loss, r.curve, r.batch_digest) for r in one_after_another
        ]
    assert not lanes_alive()


def test_each_callback_sees_the_points_it_would_see_one_group_after_another(data):
    """What pruning reads: a job's callback at step s finds the same points at s (those of the groups before its own,
    and of its own group's jobs that the trainer evaluates first) as when the groups train one after another."""

    def seen_by_callbacks(train) -> dict:
        lock, points, seen = threading.Lock(), [], {}

        def recorder(i):
            def on_eval(point) -> bool:
                with lock:
                    seen[(i, point.step)] = sorted(j for j, s in points if s == point.step)
                    points.append((i, point.step))
                return False

            return on_eval

        train(jobs(recorder))
        return seen

    in_lanes = seen_by_callbacks(lambda js: train_jobs(js, data, fuse=4, lanes=2))
    one_after_another = seen_by_callbacks(
        lambda js: [train_jobs(js[:2], data, fuse=2), train_jobs(js[2:], data, fuse=2)]
    )
    assert in_lanes == one_after_another
    assert sorted(in_lanes) == sorted((i, s) for i in range(4) for s in TRAIN.eval_steps)
    assert in_lanes[(2, TRAIN.eval_steps[0])] == [0, 1] and in_lanes[(0, TRAIN.eval_steps[0])] == [1]


def test_a_job_its_callback_stops_ends_there_and_the_others_train_on(data):
    def stop_job_1(i):
        return (lambda point: True) if i == 1 else None

    in_lanes = train_jobs(jobs(stop_job_1), data, fuse=4, lanes=2)
    one_after_another = train_jobs(jobs(stop_job_1)[:2], data, fuse=2) + train_jobs(jobs()[2:], data, fuse=2)
    assert [r.status for r in in_lanes] == ["ok", "stopped", "ok", "ok"]
    assert in_lanes[1].steps == TRAIN.eval_steps[0]
    assert [(r.val_loss, r.curve) for r in in_lanes] == [(r.val_loss, r.curve) for r in one_after_another]


def test_a_failure_in_one_lane_is_raised_and_ends_the_other(data):
    def fail_job_3(i):
        def on_eval(point) -> bool:
            raise RuntimeError("the callback failed")

        return on_eval if i == 3 else None

    with pytest.raises(RuntimeError, match="the callback failed"):
        train_jobs(jobs(fail_job_3), data, fuse=4, lanes=2)
    assert not lanes_alive()


def test_ctrl_c_ends_every_lane_before_it_is_raised(data):
    """A real SIGINT to the main thread while the lanes train. The callback that sends it waits until the handler
    has run (a hang net of 120 s, not a bound), so the lanes cannot end on their own first on a busy machine."""
    handled = threading.Event()

    def on_sigint(signum, frame):
        handled.set()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)

    def interrupt_at_job_0(i):
        def on_eval(point) -> bool:
            if point.step == TRAIN.eval_steps[0]:  # Ctrl-C, as the terminal sends it: to the main thread
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
                assert handled.wait(120)
            return False

        return on_eval if i == 0 else None

    assert threading.current_thread() is threading.main_thread()
    try:
        with pytest.raises(KeyboardInterrupt):
            train_jobs(jobs(interrupt_at_job_0), data, fuse=4, lanes=2)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert handled.is_set()
    assert not lanes_alive()
