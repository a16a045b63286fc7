"""A study's race runs keep their checkpoints in its `race` folder; a checkpoint that a study run before the rename
left in its `audit` folder is moved there when its run is trained, so the run resumes from it."""

from ilr_search.search.race import adopt_old_checkpoint, race_checkpoints, run_checkpoint
from ilr_search.storage import RunJob

JOB = RunJob("2", 1, "2,1,1")


def test_a_checkpoint_in_the_old_audit_folder_moves_to_the_race_folder(tmp_path):
    new = run_checkpoint(race_checkpoints(tmp_path / "study"), JOB)
    assert new.parent == tmp_path / "study" / "race"
    old = tmp_path / "study" / "audit" / new.name
    old.parent.mkdir(parents=True)
    old.write_bytes(b"old run")
    adopt_old_checkpoint(new)
    assert new.read_bytes() == b"old run" and not old.parent.exists()  # the emptied old folder goes too


def test_a_checkpoint_in_the_race_folder_is_kept_and_other_old_ones_stay(tmp_path):
    new = run_checkpoint(race_checkpoints(tmp_path / "study"), JOB)
    new.parent.mkdir(parents=True)
    new.write_bytes(b"new run")
    old = tmp_path / "study" / "audit" / new.name
    old.parent.mkdir(parents=True)
    old.write_bytes(b"old run")
    adopt_old_checkpoint(new)
    assert new.read_bytes() == b"new run" and old.read_bytes() == b"old run"
    adopt_old_checkpoint(run_checkpoint(race_checkpoints(tmp_path / "study"), RunJob("2", 2, "1,1,1")))
    assert old.exists()  # nothing of another run's moved
