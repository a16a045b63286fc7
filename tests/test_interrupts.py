"""Ctrl-C is never lost (interrupts.py): a KeyboardInterrupt that Python drops because it was raised inside a
weakref callback (it prints "Exception ignored" and goes on) still stops training at the next window of steps,
alone and fused, and in lanes; outside `recorded()` nothing is kept."""

import os
import signal
import sys
import time
import weakref
from dataclasses import replace

import pytest
import torch

from ilr_search.config import DataConfig, ModelConfig, TrainConfig
from ilr_search.data.tokens import load_tokens
from ilr_search.interrupts import raise_if_interrupted, recorded
from ilr_search.training.jobs import Job, train_jobs

MODEL = ModelConfig(vocab_size=256, n_layers=2, d_model=16, n_heads=2, seq_len=32)
TRAIN = TrainConfig(
    steps=64,
    batch_size=4,
    lr=1e-2,
    eval_fractions=(1.0,),
    eval_windows=4,
    dtype="fp32",
    device="cpu",
    checkpoint_every=0,
)


@pytest.fixture(scope="module")
def data(token_cache):
    return load_tokens(DataConfig(), root=token_cache)


@pytest.fixture(autouse=True)
def pythons_own_sigint_handler():
    """Python's own SIGINT handler, whatever this process inherited (a suite started in the background of a shell
    inherits SIGINT ignored, where no Ctrl-C arrives at all)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


class Dropped:
    """An object whose weakref callback receives a SIGINT: the KeyboardInterrupt is raised inside the callback,
    where Python ignores it."""


def sigint_inside_a_weakref_callback() -> None:
    def callback(_ref: weakref.ref) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the handler runs at one of these bytecodes, inside the callback
            pass

    obj = Dropped()
    ref = weakref.ref(obj, callback)  # noqa: F841 (kept alive until obj goes)
    del obj  # the callback runs here; its KeyboardInterrupt is printed as "Exception ignored" and dropped


@pytest.mark.parametrize("fuse,lanes", [(1, 1), (2, 1)])
def test_a_ctrl_c_dropped_inside_a_weakref_callback_still_stops_training(data, monkeypatch, capsys, fuse, lanes):
    torch.set_num_threads(1)
    steps_seen = []
    forwarded = []  # what reaches the hook that was there before recorded(): every dropped exception but this one
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: forwarded.append(unraisable.exc_type))

    def on_step(s: int, total: int, loss: float) -> None:
        steps_seen.append(s)
        if s == 3:
            sigint_inside_a_weakref_callback()  # returns: the interrupt was dropped

    jobs = [Job(MODEL, [0, 1], replace(TRAIN, seed=i)) for i in range(fuse)]
    with recorded(), pytest.raises(KeyboardInterrupt):
        train_jobs(jobs, data, fuse=fuse, on_step=on_step, lanes=lanes)
    assert 3 < max(steps_seen) < TRAIN.steps  # dropped at step 3 (training went on), stopped at the next window
    assert forwarded == [] and "Traceback" not in capsys.readouterr().err  # and Ctrl-C printed no traceback
    assert sys.unraisablehook is not None and sys.unraisablehook.__name__ == "<lambda>"  # the hook is given back


def test_an_exception_dropped_inside_recorded_that_is_no_ctrl_c_reaches_the_hook_that_was_there(monkeypatch):
    forwarded = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: forwarded.append(unraisable.exc_type))

    def callback(_ref: weakref.ref) -> None:
        raise ValueError("a finalizer's own error")

    with recorded():
        obj = Dropped()
        ref = weakref.ref(obj, callback)  # noqa: F841 (kept alive until obj goes)
        del obj
    assert forwarded == [ValueError]


def test_lanes_stop_on_a_recorded_interrupt_that_never_reached_the_main_thread(data):
    """In lanes the main thread waits while lane threads train; an interrupt recorded but dropped (set here as the
    handler sets it) ends every lane at its next window and is raised in the calling thread."""
    import ilr_search.interrupts as interrupts

    torch.set_num_threads(1)
    steps_seen = []

    def on_step(s: int, total: int, loss: float) -> None:
        steps_seen.append(s)
        if s == 3:
            interrupts._interrupted.set()

    jobs = [Job(MODEL, [0, 1], replace(TRAIN, seed=i)) for i in range(2)]
    with recorded(), pytest.raises(KeyboardInterrupt):
        train_jobs(jobs, data, fuse=2, on_step=on_step, lanes=2)
    assert max(steps_seen) < TRAIN.steps


def test_outside_recorded_nothing_is_kept():
    with recorded():
        pass
    raise_if_interrupted()  # no record survives the block
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
