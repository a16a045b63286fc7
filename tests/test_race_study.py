"""The race phase of a study (issues 19 and 28): contenders screened and raced at the target on more seeds (the
adaptive race; a study may ask for the fixed race), stored as race runs with their fidelity, resumed
after kill -9 with no (map, steps, seed) trained twice; the race front and verdict in `run`, `pareto` and
`trials`; bad race flags refused with nothing changed on disk."""

import json
import math
import re
import signal
import sqlite3
import subprocess
import sys

import pytest
from conftest import RACE, assert_one_line_error, run_cli, write_space
from conftest import RACE_STEPS as STEPS
from helpers import (
    alive,
    digest,
    env_for,
    race_rows,
    run_args,
    sigint_as_in_a_terminal,
    signal_all,
    spawned_children,
    wait_until,
)

from ilr_search.config import SearchConfig
from ilr_search.search.plan import plan_study
from ilr_search.search.race import run_checkpoint
from ilr_search.space import load_space
from ilr_search.storage.store import RunJob

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@pytest.fixture
def raced(raced_study):
    """The session's raced study (conftest.raced_study), read only: root, space, database, summary."""
    return raced_study.root, raced_study.space, raced_study.db, raced_study.summary


@pytest.mark.slow
def test_target_2x_races_contenders_at_more_seeds_and_twice_the_steps(raced):
    _, _, db, summary = raced
    assert summary["target_steps"] == 2 * STEPS
    results = summary["race"]["results"]
    runs = [r for r in results if r["source"].startswith("run ")]
    assert runs, "the race trained nothing"
    assert {r["steps"] for r in runs} == {2 * STEPS}  # judged at the target: nothing trained in between
    seeds_by_map: dict[str, set[int]] = {}
    for r in results:
        seeds_by_map.setdefault(r["map_key"], set()).add(r["seed"])
        assert r["schedule"].startswith("cosine") and r["steps"] >= 1 and r["seed"] in (0, 1, 2, 3)
    assert any(seeds >= {0, 1, 2} for seeds in seeds_by_map.values())  # a contender at the test seeds
    assert summary["race"]["policy"] == "adaptive" and summary["race"]["comparisons"]
    assert summary["detectable_gap"] is not None and "would have been seen with 80% power" in summary["verdict"]
    rows = race_rows(db)  # stored as race runs: factor = steps / proxy steps, one row per (factor, seed, map)
    assert len(rows) == len(runs) and all(r["state"] == "complete" for r in rows)
    assert all(r["steps"] == round(float(r["factor"]) * STEPS) for r in rows)
    assert len({(r["map_key"], r["steps"], r["seed"]) for r in rows}) == len(rows)


@pytest.mark.slow
def test_front_points_carry_length_seeds_interval_and_confirmation(raced, cli, tmp_path):
    _, _, db, summary = raced
    pareto = json.loads(cli("pareto", "--study", "raced", "--storage", f"sqlite:///{db}", "--json", check=True).stdout)
    for report in (summary, pareto):
        assert report["pareto"] and isinstance(report["verdict"], str) and report["verdict"]
        assert report["target_steps"] == 2 * STEPS
        for p in report["pareto"]:
            assert {"trial", "reuse_map", "flops_ratio", "val_ppl", "val_bpb"} <= set(p)
            assert p["steps"] in (STEPS, 2 * STEPS) and p["seeds"] and all(isinstance(s, int) for s in p["seeds"])
            low, high = p["interval"]
            assert math.isfinite(p["val_ppl"]) and low <= p["val_ppl"] <= high
            assert isinstance(p["confirmed"], bool)
    assert [p["reuse_map"] for p in pareto["pareto"]] == [p["reuse_map"] for p in summary["pareto"]]
    trials = json.loads(cli("trials", "--study", "raced", "--storage", f"sqlite:///{db}", "--json", check=True).stdout)
    assert trials["race"]["results"] == summary["race"]["results"]
    text = cli("pareto", "--study", "raced", "--storage", f"sqlite:///{db}", check=True).stdout
    first = text.splitlines()[0]
    assert (
        first.startswith(("use ", "no map beat")) and "at 48 steps" in first
    )  # the answer first, at the race's length
    figure = tmp_path / "front.html"
    cli("pareto", "--study", "raced", "--storage", f"sqlite:///{db}", "--out", str(figure), check=True)
    assert "decided front" in figure.read_text(encoding="utf-8")  # the race's front, on top (test_plots_verdict.py)


@pytest.mark.slow
def test_rerunning_a_finished_race_trains_nothing(raced, raced_study, cli, tmp_path):
    _, space, _, summary = raced
    root, db = tmp_path, raced_study.copy_to(tmp_path)  # the rerun opens it for writing
    before = race_rows(db)
    # a finished run's checkpoint left behind (its worker stopped between storing the result and deleting the file)
    # is swept by the next race over the study
    run = RunJob(str(before[0]["factor"]), before[0]["seed"], before[0]["map_key"])
    left = run_checkpoint(root / "studies" / "checkpoints" / "raced" / "race", run)
    left.parent.mkdir(parents=True)
    left.write_bytes(b"")
    again = json.loads(cli(*run_args(space, db, "raced", "--target", "2x"), cwd=root, check=True).stdout)
    assert not left.exists() and not left.parent.exists()
    assert race_rows(db) == before
    assert again["race"]["results"] == summary["race"]["results"]
    assert again["answer"] == summary["answer"] and summary["answer"].startswith(("use ", "no map beat"))
    text = cli(*[a for a in run_args(space, db, "raced", "--target", "2x") if a != "--json"], cwd=root, check=True)
    assert text.stdout.splitlines()[-1] == summary["answer"]  # the run's last line is its answer
    assert race_rows(db) == before


@pytest.mark.slow
def test_kill_9_during_the_race_then_the_same_command_resumes_training_nothing_twice(tmp_path, token_cache):
    # seeds up to 3, no equal-compute runs, two validation windows: what a kill leaves and a resume trains needs
    # no more
    space = write_space(
        tmp_path / "race.toml", search={**RACE, "max_seeds": 3, "equal_compute": "off"}, train={"eval_windows": 2}
    )
    db = tmp_path / "k.db"
    # 24-step proxies, 48-step runs at 2x (of a narrow model): the race trains several runs on each worker, and the
    # event below is seen with the run and its workers stopped, so the kill lands inside a race run at any speed
    args = run_args(space, db, "killed", "--target", "2x", "--steps", "24", "--d-model", "16", "--seq-len", "32")
    cmd = [sys.executable, "-m", "ilr_search", *args]
    env = env_for(token_cache, ILR_SEARCH_HEARTBEAT_SECONDS="1")
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=sigint_as_in_a_terminal,
    )  # its workers stop on SIGINT once it is killed
    in_flight: dict = {}  # the race runs in training when the kill lands, by (map, steps, seed)
    workers: list[int] = []  # the race's worker processes (spawned by the run), told apart by their command line

    def race_in_flight() -> bool:
        """The event: a race run in training after at least one has finished. Seen in the database while the run
        and its workers are stopped (SIGSTOP), so that no run can finish between seeing it and the kill."""
        if not any(r["state"] == "running" for r in race_rows(db)):
            return False
        workers[:] = spawned_children(proc.pid)
        frozen = [proc.pid, *workers]
        signal_all(frozen, signal.SIGSTOP)
        rows = race_rows(db, timeout=1)
        in_flight.update({(r["map_key"], r["steps"], r["seed"]): r for r in rows if r["state"] == "running"})
        if in_flight and any(r["state"] == "complete" for r in rows):
            proc.send_signal(signal.SIGKILL)
            signal_all(workers, signal.SIGCONT)  # they find their parent gone
            return True
        in_flight.clear()
        signal_all(frozen, signal.SIGCONT)
        return False

    try:
        wait_until(race_in_flight, "its race had a finished and a running run", proc)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
    # The race's worker processes see their parent gone and free their runs as Ctrl-C would (or finish the one
    # they were on first); a run the killed process trained itself keeps its stale claim. Wait for that event:
    # every worker process ended.
    wait_until(lambda: not any(alive(pid) for pid in workers), "race worker left after its parent was killed")
    before = {(r["map_key"], r["steps"], r["seed"]): r for r in race_rows(db)}
    killed = [k for k, r in before.items() if r["state"] != "complete"]
    # A worker frees the run it holds when it sees its parent gone; it may first finish the one in flight at the
    # kill (complete, then kept as it is by the resume below) and claim another. So the runs left unfinished are
    # at most one a worker process (or the run's own, when it trained the race alone).
    assert in_flight and len(in_flight) <= max(1, len(workers))
    assert len(killed) <= max(1, len(workers))
    assert all(before[k]["state"] in ("running", "interrupted") for k in killed)
    resumed = run_cli(args, tmp_path, {"ILR_SEARCH_CACHE": str(token_cache), "ILR_SEARCH_HEARTBEAT_SECONDS": "1"})
    assert resumed.returncode == 0, resumed.stderr
    after = {(r["map_key"], r["steps"], r["seed"]): r for r in race_rows(db)}
    for key, row in before.items():  # every finished run kept as it was: not trained again
        if row["state"] == "complete":
            assert after[key] == row
    assert all(after[k]["state"] == "complete" and after[k]["worker"] != before[k]["worker"] for k in killed)
    assert all(r["state"] == "complete" for r in after.values())
    summary = json.loads(resumed.stdout)
    assert {
        (r["map_key"], r["steps"], r["seed"]) for r in summary["race"]["results"] if r["source"].startswith("run ")
    } == set(after)
    assert not list((tmp_path / "studies" / "checkpoints").rglob("*.pt"))


BAD_RACES = {
    "below 1x": ["--target", "0.5x"],
    "not a multiple": ["--target", "abc"],
    "zero": ["--target", "0"],
    "negative": ["--target", "-2x"],
    "nan": ["--target", "nanx"],
    "no seed": ["--race-seeds", "0"],
    "another target on resume": ["--target", "3x"],
    "max seeds below 3": ["--max-seeds", "2"],
    "max seeds below race seeds": ["--max-seeds", "4", "--race-seeds", "5"],
    "max seeds not a number": ["--max-seeds", "many"],
    "negative cap": ["--max-race-steps", "-1"],
    "unknown policy": ["--race-policy", "best"],
    "unknown equal compute": ["--equal-compute", "width"],
    "another race on resume": ["--race-policy", "fixed"],
    "other max seeds on resume": ["--max-seeds", "6"],
}
ON_RESUME = ("another target on resume", "another race on resume", "other max seeds on resume")


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD_RACES))
def test_bad_race_input_exits_2_with_one_line_and_changes_nothing(raced, raced_study, cli, tmp_path, case):
    _, space, _, _ = raced
    root = tmp_path / "resume"
    db = raced_study.copy_to(root)  # a refused resume opens it
    before = digest(db)
    proc = cli(*run_args(space, db, "raced", *BAD_RACES[case]), cwd=root)
    assert_one_line_error(proc)
    assert digest(db) == before
    if case in ON_RESUME:
        assert "cannot resume" in proc.stderr and BAD_RACES[case][0].strip("-").split("-")[-1] in proc.stderr
        dry = cli(*run_args(space, db, "raced", *BAD_RACES[case], "--dry-run"), cwd=root)
        assert_one_line_error(dry)  # the plan refuses what the run refuses
        assert dry.stderr == proc.stderr and digest(db) == before
        return
    fresh = tmp_path / "fresh.db"
    assert_one_line_error(cli(*run_args(space, fresh, "new", *BAD_RACES[case])))
    dry = cli(*run_args(space, fresh, "new", *BAD_RACES[case], "--dry-run"))
    assert_one_line_error(dry)
    assert not fresh.exists() and not (tmp_path / "studies").exists()


def test_target_is_stored_only_when_not_the_default(tmp_path):
    default = load_space(
        write_space(
            tmp_path / "d.toml", search={"target": SearchConfig().target, "race_seeds": SearchConfig().race_seeds}
        )
    )
    longer = load_space(write_space(tmp_path / "l.toml", search={"target": 2.0}))
    assert "target" not in plan_study(default, "1.5x", None).config["search"]
    assert "race_seeds" not in plan_study(default, "1.5x", None).config["search"]
    assert plan_study(longer, "1.5x", None).config["search"]["target"] == 2.0
    assert plan_study(default, "1.5x", None).name != plan_study(longer, "1.5x", None).name


@pytest.mark.slow
def test_two_workers_race_one_study_without_training_a_run_twice(tmp_path, cli):
    # a narrow model, two validation windows, seeds up to 3: sharing the race's runs needs no more
    space = write_space(
        tmp_path / "race.toml",
        search={**RACE, "max_seeds": 3},
        model={"d_model": 16, "seq_len": 32},
        train={"eval_windows": 2},
    )
    db = tmp_path / "w.db"
    proc = cli(*run_args(space, db, "two", "--target", "2x", "--workers", "2", "--steps", "16"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    # every worker says which run it trains: each (map, steps, seed) is said once, by one worker
    said = [
        run.removeprefix("map ").replace("the plain model", "1,1,1,1")  # as output names it
        for line in proc.stderr.splitlines()
        if re.search(r"race runs?: (map |the plain model)", line)
        for run in line.split(": ", 2)[-1].split(" (fused")[0].split("; ")
    ]
    stored = race_rows(db)
    assert said and len(said) == len(set(said)) == len(stored)
    assert {f"{r['map_key']} at {r['steps']} steps, seed {r['seed']}" for r in stored} == set(said)
    assert summary["race"]["done"] and all(r["state"] == "complete" for r in stored)


@pytest.mark.slow
def test_fused_study_and_race_give_the_results_of_one_run_at_a_time(tmp_path, cli, one_usable_core):
    """Fusion changes no result: the same maps (enqueued, so the sampler does not choose them), trained one at a
    time and then with --fuse 4, give the same trial and race losses (fp32 on CPU, common random numbers). Raced in
    the run's own process (conftest.one_core): fused there as in race workers."""
    # seeds up to 3 (the race adds none while open): the equality of fused and lone runs needs no more
    space = write_space(
        tmp_path / "f.toml",
        search={**RACE, "n_trials": 4, "max_seeds": 3},
        model={"d_model": 16, "seq_len": 32},
        train={"steps": 12, "eval_windows": 2},
    )
    losses = []
    for fuse in ("1", "4"):
        db = tmp_path / f"fuse{fuse}.db"
        proc = cli(
            *run_args(
                space,
                db,
                "fused",
                "--target",
                "2x",
                "--pruner",
                "none",
                "--enqueue",
                "2,1,1,1 1,2,1,1 2,1,2,1",
                "--fuse",
                fuse,
            )
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert ("(fused, " in proc.stderr) == (fuse == "4")  # the race trained groups fused, or one at a time
        summary = json.loads(proc.stdout)
        rows = {(r["map_key"], r["factor"], r["seed"]): r["val_loss"] for r in race_rows(db)}
        assert rows and all(v is not None for v in rows.values())
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            trials = dict(
                conn.execute(
                    "SELECT a.value_json, b.value_json FROM trial_user_attributes a JOIN "
                    "trial_user_attributes b ON a.trial_id = b.trial_id WHERE a.key = 'map_key' "
                    "AND b.key = 'val_loss'"
                ).fetchall()
            )
            train_points = conn.execute("SELECT count(*) FROM ilr_train_curves").fetchone()[0]
        assert train_points > 0  # fused trials keep their training-loss curves too
        losses.append((trials, rows, summary["verdict"], train_points))
    (trials1, rows1, verdict1, points1), (trials4, rows4, verdict4, points4) = losses
    assert points1 == points4
    assert set(trials1) == set(trials4) and len(trials1) == 4
    assert all(abs(float(trials1[k]) - float(trials4[k])) < 1e-4 for k in trials1)
    assert set(rows1) == set(rows4) and any(factor != "1" for _, factor, _ in rows1)
    assert all(abs(rows1[k] - rows4[k]) < 1e-4 for k in rows1), (rows1, rows4)
    # the same verdict; its figures (printed to 4 decimals) from losses that agree within 1e-4 may differ in the last
    assert NUMBER.sub("#", verdict1) == NUMBER.sub("#", verdict4), (verdict1, verdict4)
    assert all(
        math.isclose(float(a), float(b), abs_tol=1e-3, rel_tol=1e-3)
        for a, b in zip(NUMBER.findall(verdict1), NUMBER.findall(verdict4), strict=True)
    ), (verdict1, verdict4)
