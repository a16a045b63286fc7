"""`run --dry-run`: the plan and a probed time estimate, and nothing written (no storage, no study, no tokens); on
a finished study nothing left, on a partly done one what is left, from a probe of positive step times."""

import dataclasses
import json
import os

import optuna
import pytest
from conftest import NO_REFERENCES, assert_one_line_error, frozen_run_args, one_core, run_cli, write_space


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.slow
def test_dry_run_plans_and_estimates_without_writing(cli, tmp_path, token_cache):
    space = write_space(tmp_path / "space.toml", train={"eval_fractions": [0.5, 1.0]})
    before_cache, before_here = _files(token_cache), _files(tmp_path)
    proc = cli(
        "run",
        "--space",
        str(space),
        "--budget",
        "2x",
        "--n-trials",
        "5",
        "--storage",
        f"sqlite:///{tmp_path / 'r.db'}",
        "--dry-run",
        "--json",
        check=True,
    )
    plan = json.loads(proc.stdout)
    assert plan["dry_run"] and not plan["resume"] and not plan["storage_exists"]
    assert plan["n_trials"] == 5 and plan["trials_to_train"] == 5
    assert plan["pruning_rungs"] == [12]  # steps 24, evaluated at 0.5 and 1.0: the rung before the end
    assert {"baseline_seed1", "baseline_seed2", "second_seed", "block2"} == set(plan["references"])
    baseline, costliest = plan["probe"]
    assert baseline["reuse_map"] == [1, 1, 1, 1] and costliest["layer_runs"] == plan["budget"]["max_layer_runs"]
    assert plan["estimated_seconds"] > 0
    assert _files(token_cache) == before_cache and _files(tmp_path) == before_here  # nothing written


@pytest.mark.slow
def test_dry_run_does_not_create_a_study_in_an_existing_storage(cli, tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    # another program's study, with a trial: refused at once (with no trial, `run` first waits 10 s for the
    # configuration that a worker which has just made the study may be about to store; search/plan.check_resume)
    optuna.create_study(study_name="other", storage=url).add_trial(optuna.trial.create_trial(value=0.0))
    space = write_space(tmp_path / "space.toml", search=NO_REFERENCES)
    size = (tmp_path / "r.db").stat().st_size
    proc = cli(
        "run", "--space", str(space), "--budget", "2x", "--storage", url, "--study", "planned", "--dry-run", check=True
    )
    assert "planned (new)" in proc.stdout and "estimated time" in proc.stdout
    assert [s.study_name for s in optuna.get_all_study_summaries(url)] == ["other"]
    assert (tmp_path / "r.db").stat().st_size == size
    assert_one_line_error(
        cli("run", "--space", str(space), "--budget", "2x", "--storage", url, "--study", "other", "--dry-run")
    )  # not an ilr-search study: refused as `run` refuses it


FINISHED_ARGS = ["--budget", "2x", "--steps", "8", "--target", "2x", "--equal-compute", "off", "--max-seeds", "3"]


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory, token_cache):
    """A tiny study run to its end: 3 trials of 8 steps, then a race at 16 steps that decides."""
    root = tmp_path_factory.mktemp("finished")
    space = write_space(root / "space.toml", search=NO_REFERENCES)
    db = root / "s.db"
    args = ["--space", str(space), *FINISHED_ARGS, "--storage", f"sqlite:///{db}"]
    with one_core():  # raced in this process (conftest.one_core)
        proc = run_cli(["run", *args, "--n-trials", "3", "--json"], root, {"ILR_SEARCH_CACHE": str(token_cache)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["race"]["done"]
    return db, args


@pytest.mark.slow
def test_the_dry_run_of_a_finished_study_says_nothing_is_left(cli, finished_study):
    db, args = finished_study
    before = db.read_bytes()
    plan = json.loads(cli("run", *args, "--n-trials", "3", "--dry-run", "--json", check=True).stdout)
    assert plan["finished"] and plan["left"] == "nothing is left to train: the study is finished"
    assert plan["trials_to_train"] == 0 and plan["references_to_train"] == []
    assert plan["race"]["decided"] and plan["race"]["runs_max"] == 0 and "estimated_seconds" not in plan
    text = cli("run", *args, "--n-trials", "3", "--dry-run", check=True).stdout
    assert "nothing is left to train: the study is finished" in text and "estimated time" not in text
    assert db.read_bytes() == before


@pytest.mark.slow
def test_the_dry_run_loads_the_stored_study_once(cli, finished_study, monkeypatch):
    """The stored study is loaded once (search/run.open_request), for its dtype, race, resume check, trials,
    references and race runs alike."""
    db, args = finished_study
    loaded, load_study = [], optuna.load_study
    monkeypatch.setattr(optuna, "load_study", lambda **kw: loaded.append(kw["study_name"]) or load_study(**kw))
    plan = json.loads(cli("run", *args, "--n-trials", "3", "--dry-run", "--json", check=True).stdout)
    assert plan["resume"] and loaded == [plan["study"]]


@pytest.mark.slow
def test_the_dry_run_of_a_partly_done_study_plans_what_is_left_from_a_positive_probe(cli, finished_study):
    db, args = finished_study
    before = db.read_bytes()
    plan = json.loads(cli("run", *args, "--n-trials", "4", "--dry-run", "--json", check=True).stdout)
    assert not plan["finished"] and plan["left"] is None
    assert plan["trials_to_train"] == 1 and plan["finished_trials"] == 3
    assert not plan["race"]["decided"] and plan["race"]["steps_trained"] > 0
    for probe in plan["probe"]:
        assert probe["seconds_per_step"] > 0 and probe["seconds_per_eval"] > 0
        assert 1 <= probe["side_by_side"] <= max(1, len(os.sched_getaffinity(0)))  # the run's lanes, as it trains
        assert len(probe["step_seconds"]) == 7 * probe["side_by_side"] and all(s > 0 for s in probe["step_seconds"])
    assert 0 < plan["estimated_seconds"] <= plan["estimated_seconds_max"]
    text = cli("run", *args, "--n-trials", "4", "--dry-run", check=True).stdout
    assert " 0.0 ms" not in text and "race time" not in text and text.count("estimated time left") == 1
    assert db.read_bytes() == before


def test_the_frozen_dry_run_plans_evaluations_and_times_them(cli, tmp_path, recurrent_checkpoint):
    """A frozen study's dry run: maps to evaluate, chunks of eval_windows, the race in evaluations (no step), and a
    time range from a probe of the checkpoint's evaluation; nothing is written."""
    from conftest import write_space

    space = write_space(
        tmp_path / "frozen.toml", search={"n_trials": 3, "race_seeds": 3, "max_seeds": 5}, train={"eval_windows": 8}
    )
    db = tmp_path / "frozen.db"
    proc = cli(
        *frozen_run_args(space, recurrent_checkpoint, "1.5x", f"sqlite:///{db}"),
        "--dry-run",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["race"]["frozen"] and plan["race"]["steps_max"] == 0 and plan["chunk_size"] == 8
    assert plan["trials_to_train"] == 3 and plan["references"] == []
    assert 0 < plan["race"]["runs_min"] <= plan["race"]["runs_max"]
    assert 0 < plan["estimated_seconds"] <= plan["estimated_seconds_max"]
    assert not db.exists() and not (tmp_path / "studies").exists()
    shown = cli(
        *frozen_run_args(space, recurrent_checkpoint, "1.5x", f"sqlite:///{db}"),
        "--dry-run",
    )
    assert shown.returncode == 0 and "maps to evaluate" in shown.stdout and "test chunks" in shown.stdout
    assert "seed" not in shown.stdout and "trials to train" not in shown.stdout


def test_the_race_estimate_prices_each_run_at_its_own_depth():
    """The most: every recurrent run and the equal-compute model at the budget's most layer runs, the baseline at
    its own; the least: the first test seeds at an average map; a race left half done costs half."""
    from ilr_search.commands.dryrun import AdaptiveRace, RacePlan, race_seconds

    shape = AdaptiveRace(screen=4, contenders=3, first_test_seeds=2, max_seeds=5, equal_compute="depth")
    least_runs, most_runs = 4 + 3 * 2 + 3, 4 + 3 * 4 + 5
    race = RacePlan("adaptive", 100, least_runs, most_runs, least_runs * 100, most_runs * 100, shape)
    seconds = race_seconds(race, lambda layer_runs: layer_runs, plain=8, mid=10, most=12)
    assert seconds == (8 + 3 * 10 + 2 * (8 + 2 * 10) + 3 * 10, 8 + 3 * 12 + 4 * (8 + 2 * 12) + 5 * 12)
    half = dataclasses.replace(race, steps_min=race.steps_min // 2, steps_max=race.steps_max // 2)
    assert race_seconds(half, lambda layer_runs: layer_runs, 8, 10, 12) == pytest.approx(
        (seconds[0] * (least_runs * 50) / (least_runs * 100), seconds[1] * (most_runs * 50) / (most_runs * 100))
    )
    off = dataclasses.replace(shape, equal_compute="off")
    no_deep = race_seconds(dataclasses.replace(race, shape=off), lambda r: r, 8, 10, 12)
    assert no_deep[1] < seconds[1]


def test_a_race_wave_lasts_as_long_as_its_busiest_worker():
    """The race's workers share a wave in fused groups of up to min(fuse, ceil(runs / workers)), each group to the
    worker free first (search/race.run_race): three runs on two workers take two runs' time, twelve in groups of
    four take eight (the third group alone)."""
    from ilr_search.commands.dryrun import AdaptiveRace, RacePlan, race_seconds, race_waves, wave_seconds

    assert wave_seconds([1.0] * 3, 2, 4) == 2
    assert wave_seconds([1.0] * 3, 1, 4) == 3
    assert wave_seconds([1.0] * 5, 2, 4) == 3
    assert wave_seconds([1.0] * 8, 2, 4) == 4
    assert wave_seconds([1.0] * 12, 2, 4) == 8
    assert wave_seconds([8.0, 12.0, 12.0], 2, 1) == 20  # one run a group: the baseline's worker takes the third
    shape = AdaptiveRace(screen=12, contenders=3, first_test_seeds=2, max_seeds=8, equal_compute="depth")
    assert [len(w) for w in race_waves(shape, least=False)] == [5, 5, 2, 6, 3, 3, 3, 3, 3, 8]
    assert [len(w) for w in race_waves(shape, least=True)] == [5, 5, 2, 6, 3]
    assert [len(w) for w in race_waves(dataclasses.replace(shape, look_every=2), least=False)] == [
        5,
        5,
        2,
        6,
        6,
        6,
        3,
        8,
    ]
    runs = (12 + 6 + 3, 12 + 3 * 7 + 8)
    race = RacePlan("adaptive", 100, *runs, runs[0] * 100, runs[1] * 100, shape)
    one = race_seconds(race, lambda layer_runs: layer_runs, 8, 10, 12)
    two = race_seconds(race, lambda layer_runs: layer_runs, 8, 10, 12, processes=2, fuse=4)
    assert all(one_worker / 2 < two_workers < one_worker for one_worker, two_workers in zip(one, two, strict=True))


def test_the_probed_line_never_prices_a_deeper_map_below_a_shallower_one():
    from ilr_search.commands.dryrun import Probe, probed_seconds

    def probe(layer_runs: int, step: float, evaluation: float) -> Probe:
        return Probe("p", [1] * 8, layer_runs, 1, 1, step, evaluation, [step])

    baseline = probe(8, 0.010, 0.5)
    # probes in order: the line through them prices a deeper map higher, beyond the costliest too
    costly = probe(16, 0.020, 1.0)
    assert probed_seconds(baseline, costly, 12, 100, 4) == pytest.approx(100 * 0.015 + 4 * 0.75)
    assert probed_seconds(baseline, costly, 24, 100, 4) == pytest.approx(100 * 0.030 + 4 * 1.5)
    # the costliest probe timed below the baseline (a loaded machine): deeper maps cost the baseline's, not less
    noisy = probe(16, 0.008, 0.4)
    seconds = [probed_seconds(baseline, noisy, runs, 24, 4) for runs in (8, 12, 16, 32)]
    assert seconds == [pytest.approx(24 * 0.010 + 4 * 0.5)] * 4
