"""A study's race runs keep their checkpoints in its `race` folder, one file a run (factor, seed and map), which
the race and the audit share so that either resumes the other's."""

from ilr_search.search.race import race_checkpoints, run_checkpoint
from ilr_search.storage import RunJob


def test_a_race_runs_checkpoint_is_named_by_its_job_in_the_race_folder(tmp_path):
    path = run_checkpoint(race_checkpoints(tmp_path / "study"), RunJob("2", 1, "2,1,1"))
    assert path == tmp_path / "study" / "race" / "2x-seed1-2-1-1.pt"
    assert run_checkpoint(race_checkpoints(tmp_path / "study"), RunJob("2", 2, "2,1,1")) != path
