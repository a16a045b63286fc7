"""`run --dry-run`: the plan and a probed time estimate, and nothing written (no storage, no study, no tokens)."""

import json

import optuna
import pytest

from conftest import NO_REFERENCES, assert_one_line_error, write_space


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.slow
def test_dry_run_plans_and_estimates_without_writing(cli, tmp_path, token_cache):
    space = write_space(tmp_path / "space.toml", train={"eval_fractions": [0.5, 1.0]})
    before_cache, before_here = _files(token_cache), _files(tmp_path)
    proc = cli("run", "--space", str(space), "--budget", "2x", "--n-trials", "5", "--storage",
               f"sqlite:///{tmp_path / 'r.db'}", "--dry-run", "--json", check=True)
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
    optuna.create_study(study_name="other", storage=url)
    space = write_space(tmp_path / "space.toml", search=NO_REFERENCES)
    size = (tmp_path / "r.db").stat().st_size
    proc = cli("run", "--space", str(space), "--budget", "2x", "--storage", url, "--study", "planned", "--dry-run",
               check=True)
    assert "planned (new)" in proc.stdout and "estimated time" in proc.stdout
    assert [s.study_name for s in optuna.get_all_study_summaries(url)] == ["other"]
    assert (tmp_path / "r.db").stat().st_size == size
    assert_one_line_error(cli("run", "--space", str(space), "--budget", "2x", "--storage", url, "--study", "other",
                              "--dry-run"))  # not an ilr-search study: refused as `run` refuses it
