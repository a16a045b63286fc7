"""What a run prints: the front only when it changed, reference runs under their own label, a study ETA from
measured trial times, and its report ending with the phase table and the answer."""

import optuna
import pytest
from conftest import write_space
from helpers import stored_reference_dicts

from ilr_search.analysis.results import study_front
from ilr_search.cli.live import StudyEta
from ilr_search.storage.trials import told_trials


@pytest.mark.slow
def test_the_front_is_printed_only_when_it_changed_and_references_have_their_own_label(tmp_path, cli):
    space = write_space(tmp_path / "space.toml", search={"noise_seeds": 1, "families": ["ilr"]})
    db = tmp_path / "out.db"
    proc = cli(
        "run",
        "--space",
        str(space),
        "--budget",
        "2x",
        "--steps",
        "8",
        "--n-trials",
        "6",
        "--study",
        "o",
        "--storage",
        f"sqlite:///{db}",
        "--sampler",
        "random",
        check=True,
    )
    study = optuna.load_study(study_name="o", storage=f"sqlite:///{db}")
    trials = told_trials(study)
    n_references = len(stored_reference_dicts(f"sqlite:///{db}", "o"))
    fronts, changes = [], 0
    for n in range(1, len(trials) + 1):  # the front after each finished trial, as the run saw it
        if not trials[n - 1].has_result:
            continue
        front = [p.trial for p in study_front(trials[:n])]
        if front and front != (fronts[-1] if fronts else None):
            changes += 1
        fronts.append(front)
    assert 1 <= changes < len(fronts), "the study's front changed after every trial: the test shows nothing"
    assert proc.stderr.count("current front") == changes
    # the last progress rows: the study counting its reference runs, and the reference's own row
    assert n_references == 2
    progress_rows = [line for line in proc.stderr.splitlines() if "━" in line]
    assert " reference second_seed " in progress_rows[-1]  # its own label, not the last trial's
    last_study_row = [line for line in proc.stderr.splitlines() if line.startswith("study ")][-1]
    assert f"{6 + n_references}/{6 + n_references} references" in last_study_row
    # the run's report: where its time went (the phase table), then the answer as the last line
    assert "phases (cpu%: of one core)" in proc.stdout and " trials " in proc.stdout
    assert proc.stdout.splitlines()[-1].startswith(("use ", "no map beat", "no decision yet")), proc.stdout


def test_the_study_eta_comes_from_measured_trial_times_from_the_first_trial_on():
    eta = StudyEta(started=100.0)
    assert eta.seconds_left(100.0, 0, 0.0, 16) is None  # nothing measured yet
    # half of the first trial in 30 s: 15.5 trials left at 60 s each
    assert eta.seconds_left(130.0, 0, 0.5, 16) == pytest.approx(15.5 * 60)
    # 4 trials and a quarter of the fifth in 170 s: 40 s each, 11.75 left
    assert eta.seconds_left(270.0, 4, 0.25, 12) == pytest.approx(11.75 * 40)
    assert eta.seconds_left(500.0, 16, 1.0, 1) == 0.0
