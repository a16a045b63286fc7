"""`run --fuse auto` (issue 20): K, and on a CPU workers against threads, chosen by a measured probe and said in one
line; a K that does not fit in memory refused before anything is written."""

import hashlib
import json
import re
from collections import Counter

import optuna
import pytest
from conftest import NO_REFERENCES, assert_one_line_error, write_space
from helpers import run_args

from ilr_search.commands.autofuse import parse_fuse
from ilr_search.errors import UserInputError
from ilr_search.space import SpaceError, load_space

NO_PRUNING = ("--pruner", "none")


@pytest.mark.slow
def test_fuse_auto_in_the_space_probes_says_what_it_chose_and_the_run_trains_that_way(cli, tmp_path):
    # a narrow model, 12-step proxies, two validation windows: the probe and the run's grouping need no size
    space = write_space(
        tmp_path / "auto.toml",
        search=NO_REFERENCES | {"fuse": "auto"},
        model={"d_model": 16, "seq_len": 32},
        train={"steps": 12, "eval_windows": 2},
    )
    proc = cli(*run_args(space, tmp_path / "auto.db", "auto", *NO_PRUNING, n_trials=6), check=True)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("fuse auto:")]
    assert len(lines) == 1, proc.stderr
    chosen = re.match(r"fuse auto: (?:(\d+) workers|1 process)[^,]*, K = (\d+)", lines[0])
    if chosen:
        workers, k = int(chosen.group(1) or 1), int(chosen.group(2))
    else:  # no probe finished within the probe's own time limit (a loaded machine): one process, unfused, said why
        assert re.match(r"fuse auto: K = 1 \(no probe done in \d+ s: .*not done in", lines[0]), lines[0]
        workers, k = 1, 1
    summary = json.loads(proc.stdout)
    assert len(summary.get("workers", [None])) == workers
    trials = optuna.load_study(study_name="auto", storage=f"sqlite:///{tmp_path / 'auto.db'}").get_trials()
    finished = [t for t in trials if t.state.is_finished() and not t.user_attrs.get("surplus")]
    assert len(finished) == summary["n_trials"] == 6
    trained = Counter(t.user_attrs["map_key"] for t in finished if "reused_from" not in t.user_attrs)
    assert max(trained.values()) == 1, trained
    groups = {t.user_attrs.get("fused_group", 1) for t in finished}
    assert max(groups) <= k and (k == 1) == (groups == {1}), (groups, k)


@pytest.mark.slow
def test_a_fuse_that_does_not_fit_in_memory_is_refused_with_one_line_and_nothing_on_disk(cli, tmp_path):
    space = write_space(tmp_path / "big.toml", model={"d_model": 4096, "heads": 8}, search=NO_REFERENCES)
    fresh = tmp_path / "fresh.db"
    proc = cli(*run_args(space, fresh, "auto", *NO_PRUNING, "--fuse", "1024", n_trials=2))
    assert_one_line_error(proc)
    assert "--fuse 1024" in proc.stderr and "GiB" in proc.stderr
    assert not fresh.exists()
    db = tmp_path / "kept.db"
    cli(
        *run_args(write_space(tmp_path / "small.toml", search=NO_REFERENCES), db, "auto", *NO_PRUNING, n_trials=1),
        check=True,
    )
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    assert_one_line_error(cli(*run_args(space, db, "other", *NO_PRUNING, "--fuse", "1024", n_trials=2)))
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_fuse_is_a_positive_number_or_auto_on_the_command_line_and_in_a_space(tmp_path):
    assert parse_fuse("auto") == "auto" and parse_fuse("AUTO") == "auto" and parse_fuse("3") == 3
    for bad in ("0", "-1", "1.5", "fast", ""):
        with pytest.raises(UserInputError):
            parse_fuse(bad)
    assert load_space(write_space(tmp_path / "a.toml", search={"fuse": "auto"})).search.fuse == "auto"
    for bad in ("fast", 0, True):
        with pytest.raises(SpaceError):
            load_space(write_space(tmp_path / "b.toml", search={"fuse": bad}))
