"""Every event a run emits (search/progress.py) has a renderer in the CLI (cli/live.py), dispatched by its type: a
renamed or new event class without one fails here, not silently on screen."""

import ast
import dataclasses
import typing

import pytest
from conftest import ROOT

from ilr_search.analysis.replicates import Replicates
from ilr_search.cli.live import ConsoleReporter
from ilr_search.search import progress


def event_classes() -> list[type]:
    """The dataclasses defined in search/progress.py (read from its source: a new one counts at once)."""
    tree = ast.parse((ROOT / "ilr_search" / "search" / "progress.py").read_text(encoding="utf-8"))
    names = [
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list)
    ]
    return [getattr(progress, name) for name in names]


def test_every_event_class_is_an_event_and_has_a_renderer():
    classes = event_classes()
    assert len(classes) >= 9
    assert set(classes) == set(typing.get_args(progress.Event)), "progress.Event must list every event class"
    registry = ConsoleReporter.__dict__["on"].dispatcher.registry
    missing = [c.__name__ for c in classes if c not in registry]
    assert not missing, f"no renderer in cli/live.py for {missing}"


def test_each_event_is_drawn_by_its_own_renderer(capsys):
    reporter = ConsoleReporter(enabled=True)
    with reporter:
        reporter.on(progress.StudyStarted("s", 2, 0))
        reporter.on(progress.Message("hello from the run"))
        reporter.on(progress.RunFinished("2,1", 48, 1, 12.5))
    err = capsys.readouterr().err
    assert "study s: 0 of 2 trials finished" in err and "hello from the run" in err
    assert "race run done: map 2,1 at 48 steps, seed 1: ppl 12.5" in err


def test_an_object_that_is_no_event_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Unknown:
        worker: int | None = None

    with pytest.raises(TypeError, match="no renderer for Unknown"):
        ConsoleReporter(enabled=False).on(Unknown())  # type: ignore[arg-type]


def test_the_plain_model_is_named_so_in_a_study_of_blocks_and_of_maps(capsys):
    plain = ",".join(["1"] * 30)
    with ConsoleReporter(enabled=True) as reporter:
        reporter.on(progress.StudyStarted("b", 3, 0, words=Replicates(frozen=True, blocks=True)))
        reporter.on(progress.TrialStarted(0, [1] * 30, 0))
        reporter.on(progress.TrialStarted(1, [1] * 30, 0, map="block:3-5:2"))
        reporter.on(progress.RunFinished(plain, 0, 1, 12.5))
    err = capsys.readouterr().err
    assert "trial 0: evaluating the plain model on window chunk 0" in err
    assert "trial 1: evaluating map block:3-5:2 on window chunk 0" in err
    assert "race run done: the plain model" in err and plain not in err
    with ConsoleReporter(enabled=True) as reporter:
        reporter.on(progress.StudyStarted("m", 3, 0))
        reporter.on(progress.TrialStarted(0, [1, 1, 1, 1], 32))
        reporter.on(progress.TrialStarted(1, [1, 3, 1, 1], 32, map="1,3a,1,1"))
    err = capsys.readouterr().err
    assert "trial 0: training the plain model" in err and "1,1,1,1" not in err
    assert "trial 1: training map 1,3a,1,1" in err
