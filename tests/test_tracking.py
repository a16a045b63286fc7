"""`run --track`: TensorBoard event files per trial hold the trial's validation curve and final values;
a bad or unavailable tracker is one error line before anything is written."""

import importlib.util
import json

import pytest
from conftest import assert_one_line_error, write_space


@pytest.mark.slow
def test_tensorboard_event_files_hold_each_trials_curve(cli, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from ilr_search.storage import open_store, parse_storage

    space = write_space(tmp_path / "space.toml", search={"noise_seeds": 1, "families": ["ilr"]})
    url = f"sqlite:///{tmp_path / 'r.db'}"
    proc = cli(
        "run",
        "--space",
        str(space),
        "--budget",
        "2x",
        "--n-trials",
        "3",
        "--study",
        "tb",
        "--storage",
        url,
        "--pruner",
        "none",
        "--track",
        f"tensorboard:{tmp_path / 'tb'}",
        "--json",
        check=True,
    )
    summary = json.loads(proc.stdout)
    curves = {}
    for p in open_store(parse_storage(url), "tb", read_only=True).curve_points():
        curves.setdefault(p.trial_number, []).append((p.step, p.val_loss))
    runs = sorted(d.name for d in (tmp_path / "tb" / "tb").iterdir())
    assert [r for r in runs if r.startswith("trial-")] == [f"trial-{n:04d}" for n in range(3)]
    assert {"reference-baseline_seed1", "reference-second_seed"} <= set(runs)
    for number, curve in curves.items():
        events = EventAccumulator(str(tmp_path / "tb" / "tb" / f"trial-{number:04d}"))
        events.Reload()
        logged = [(e.step, e.value) for e in events.Scalars("val_loss")]
        assert [s for s, _ in logged] == [s for s, _ in sorted(curve)]
        assert [v for _, v in logged] == pytest.approx([v for _, v in sorted(curve)], rel=1e-6)
    best = min(summary["pareto"], key=lambda p: p["val_ppl"])
    events = EventAccumulator(str(tmp_path / "tb" / "tb" / f"trial-{best['trial']:04d}"))
    events.Reload()
    assert events.Scalars("final/val_ppl")[-1].value == pytest.approx(best["val_ppl"], rel=1e-6)


@pytest.mark.parametrize("track", ["wandb:x", "tensorboard", "mlflow:"])
def test_bad_track_is_one_error_line_and_writes_nothing(cli, tmp_path, track):
    proc = cli(
        "run",
        "--space",
        str(write_space(tmp_path / "space.toml")),
        "--budget",
        "2x",
        "--storage",
        f"sqlite:///{tmp_path / 'r.db'}",
        "--track",
        track,
    )
    assert_one_line_error(proc)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.toml"]


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is not None, reason="mlflow is installed")
def test_mlflow_without_the_package_says_so(cli, tmp_path):
    proc = cli(
        "run",
        "--space",
        str(write_space(tmp_path / "space.toml")),
        "--budget",
        "2x",
        "--storage",
        f"sqlite:///{tmp_path / 'r.db'}",
        "--track",
        f"mlflow:file:{tmp_path / 'mlruns'}",
    )
    assert_one_line_error(proc)
    assert "mlflow" in proc.stderr and not (tmp_path / "r.db").exists()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow is not installed")
def test_mlflow_runs_hold_each_trials_curve(cli, tmp_path):
    from mlflow.tracking import MlflowClient

    space = write_space(tmp_path / "space.toml", search={"noise_seeds": 0, "families": ["ilr"]})
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cli(
        "run",
        "--space",
        str(space),
        "--budget",
        "2x",
        "--n-trials",
        "2",
        "--study",
        "ml",
        "--storage",
        f"sqlite:///{tmp_path / 'r.db'}",
        "--pruner",
        "none",
        "--track",
        f"mlflow:{uri}",
        check=True,
    )
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("ml").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["trial-0000", "trial-0001"]
    for r in runs:
        history = client.get_metric_history(r.info.run_id, "val_loss")
        assert [m.step for m in sorted(history, key=lambda m: m.step)] == [6, 12, 24]
        assert r.data.params["map"].count(",") == 3 and "val_ppl" in r.data.metrics
