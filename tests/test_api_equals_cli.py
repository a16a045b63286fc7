"""One entry path: the Python API (commands/run.run_study, as README shows it) and `ilr-search run` give the same
study from one space: the same layout, trials, curves, reference runs and race, to the last digit. The space fuses
its maps (K = 2) and races, the two settings where the API once trained another study than the CLI."""

import math
from pathlib import Path

import pytest

from ilr_search.search.studies import open_study
from ilr_search.storage import open_store, parse_storage, study_storage

TIMINGS = (
    "seconds",
    "per_second",
    "datetime",
    "heartbeat",
    "worker",
    "started",
    "elapsed",
)  # how long, when and who, not what


def untimed(value):
    """`value` without the fields that record when, how long and by whom: the study as numbers and maps."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if not any(t in k for t in TIMINGS)}
    if isinstance(value, list | tuple):
        return [untimed(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def differences(a, b, path: str = "") -> list[str]:
    """Where `a` and `b` differ, as paths into them (with both values), for the failure message."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"[:400]]


def stored(db: Path, name: str) -> dict:
    spec = parse_storage(f"sqlite:///{db}", read_only=True)
    study = open_study(spec, name)
    store = open_store(spec, name, read_only=True, storage=study_storage(study))
    trials = [
        {"number": t.number, "state": t.state.name, "params": t.params, "values": t.values, "attrs": t.user_attrs}
        for t in study.get_trials(deepcopy=False)
    ]
    race = sorted(
        (r.job.map_key, r.job.factor, r.job.seed, r.state, r.steps, r.val_loss, r.curve) for r in store.race_runs()
    )
    curves = sorted((p.trial_number, p.step, p.val_loss, p.map_key) for p in store.curve_points())
    return untimed({"attrs": study.user_attrs, "trials": trials, "race": race, "curves": curves})


@pytest.mark.slow
def test_the_api_and_the_cli_store_the_same_study(fused_raced_study, fused_raced_study_by_api):
    # the session's fused raced study (conftest.FUSED_RACE: fused K = 2, raced at 2x, a narrow model, 12-step
    # proxies and two validation windows: the comparison is to the last digit at any size) as `run` made it at a
    # quiet load average and as the API made it from the same space file and budget at a busy one
    cli, api = fused_raced_study, fused_raced_study_by_api
    cli_study, api_study = stored(cli.db, cli.study), stored(api.db, api.study)
    assert cli_study["race"], "the space races: the comparison covers the race"
    assert any(t["state"] == "COMPLETE" for t in api_study["trials"])
    assert not differences(cli_study, api_study), differences(cli_study, api_study)[:20]
    assert api.answer == cli.summary["answer"]  # the API report's answer line, the line `run --json` gives
