"""A study that searches recurrence knobs with the map: stores and resumes them, never trains one (map,
knobs) twice, shows them, and audits each trial with its own knobs."""

import json
from collections import Counter

import optuna
import pytest
from conftest import ROOT, assert_one_line_error
from helpers import run_args

from ilr_search.commands.audit import run_audit
from ilr_search.options import AuditSettings

SPACE = ROOT / "tests" / "spaces" / "cli.toml"
SMALL = ["--layers", "3", "--d-model", "16", "--heads", "2", "--seq-len", "32", "--batch-size", "4", "--dtype", "fp32"]
KNOBS = "injection,iteration_norms"
PROXY = {"budget": "1.7x", "steps": 16}


@pytest.mark.slow
def test_a_study_searches_stores_and_resumes_knobs(cli, tmp_path):
    db = tmp_path / "k.db"
    first = json.loads(cli(*run_args(SPACE, db, "k", *SMALL, "--knobs", KNOBS, **PROXY, n_trials=6), check=True).stdout)
    assert first["n_complete"] + first["n_pruned"] == 6
    more = json.loads(cli(*run_args(SPACE, db, "k", *SMALL, "--knobs", KNOBS, **PROXY, n_trials=14), check=True).stdout)
    assert more["n_complete"] + more["n_pruned"] == 14

    study = optuna.load_study(study_name="k", storage=f"sqlite:///{db}")
    config = study.user_attrs["ilr:config"]
    assert config["search"]["knobs"] == ["injection", "iteration_norms"] and config["search"]["init_depth"] == 5
    trials = [t for t in study.trials if t.state.is_finished()]
    assert all(set(t.params) == {"r0", "r1", "r2", "injection", "iteration_norms"} for t in trials)
    assert all(
        t.user_attrs["knobs"] == {"injection": t.params["injection"], "iteration_norms": t.params["iteration_norms"]}
        for t in trials
    )
    # the enqueued first maps run with the knobs off; the sampler then tries them on
    assert trials[0].user_attrs["map_key"] == "1,1,1" and trials[0].user_attrs["knobs"] == {
        "injection": "none",
        "iteration_norms": False,
    }
    assert len({t.user_attrs["map_key"] for t in trials}) > len({tuple(t.user_attrs["reuse_map"]) for t in trials})
    # one training per (map, knobs); a repeated proposal reuses the result
    trained = Counter(t.user_attrs["map_key"] for t in trials if "reused_from" not in t.user_attrs)
    assert trained and max(trained.values()) == 1, trained
    for t in trials:
        if "reused_from" in t.user_attrs:
            source = study.trials[t.user_attrs["reused_from"]]
            assert source.user_attrs["map_key"] == t.user_attrs["map_key"]
    # params count the knobs' own parameters: gains of 3 layers x (max_reuse 4 - 1) repeats x 2 norms x 16
    # (compared at one injection setting: gated injection adds one gate per layer)
    counts: dict[tuple[str, bool], set[int]] = {}
    for t in trials:
        counts.setdefault((t.user_attrs["knobs"]["injection"], t.user_attrs["knobs"]["iteration_norms"]), set()).add(
            t.user_attrs["params"]
        )
    assert all(len(c) == 1 for c in counts.values()), counts
    params = {k: c.pop() for k, c in counts.items()}
    pairs = [
        (params[(i, False)], params[(i, True)])
        for i in ("none", "add", "gated")
        if (i, False) in params and (i, True) in params
    ]
    assert pairs and all(normed - plain == 3 * 3 * 2 * 16 for plain, normed in pairs), params

    # another knob list is another study: refused, nothing changes
    before = db.read_bytes()
    refused = cli(*run_args(SPACE, db, "k", *SMALL, "--knobs", "injection", **PROXY, n_trials=14))
    assert_one_line_error(refused)
    assert "knobs" in refused.stderr and db.read_bytes() == before
    bad = cli(*run_args(SPACE, db, "k", *SMALL, "--knobs", "injection,lora", **PROXY, n_trials=14))
    assert_one_line_error(bad)
    assert "unknown knob" in bad.stderr and db.read_bytes() == before

    # the trials table and export show the knobs
    listed = json.loads(cli("trials", "--study", "k", "--storage", f"sqlite:///{db}", "--json", check=True).stdout)
    assert any(r["knobs"] and "injection=" in r["knobs"] for r in listed["trials"])
    table = cli("trials", "--study", "k", "--storage", f"sqlite:///{db}", check=True).stdout
    assert "knobs" in table
    cli("export", "--study", "k", "--storage", f"sqlite:///{db}", "--out", str(tmp_path / "t.csv"), check=True)
    assert "knobs" in (tmp_path / "t.csv").read_text().splitlines()[0]
    layers = json.loads(
        cli("pareto", "--study", "k", "--storage", f"sqlite:///{db}", "--view", "layers", "--json", check=True).stdout
    )["layers"]
    assert {"knob injection", "knob iteration_norms"} <= set(layers["importance"])

    # the audit retrains each map with its own knobs: at 1x steps and the study's seed it reproduces the proxy
    # exactly (on this CPU, in fp32), which it could not with the knobs left off
    knobbed = [
        t
        for t in trials
        if t.state == optuna.trial.TrialState.COMPLETE
        and "reused_from" not in t.user_attrs
        and (t.user_attrs["knobs"]["injection"] != "none" or t.user_attrs["knobs"]["iteration_norms"])
    ]
    assert knobbed
    audit = run_audit(
        "k", f"sqlite:///{db}", AuditSettings(factor=1.0, maps="all", seeds=1), checkpoint_dir=tmp_path / "ck"
    ).to_json()
    by_key = {m["reuse_map"]: m for m in audit["maps"]}
    assert all(t.user_attrs["map_key"] in by_key for t in knobbed)
    for t in knobbed:
        audited = by_key[t.user_attrs["map_key"]]
        assert abs(audited["audit_ppl"] - t.user_attrs["val_ppl"]) < 1e-6 * t.user_attrs["val_ppl"], (t.number, audited)


@pytest.mark.slow
def test_a_space_searches_repeat_scale_fused_where_it_can(cli, tmp_path):
    """`[search] knobs = ["repeat_scale"]`: the three settings of one map are three trials; fused groups train
    "off" and "residual" together and "lr" (which the fused trainer refuses) alone, and the audit, one map at a
    time, reproduces each."""
    from conftest import write_space

    space = write_space(
        tmp_path / "rs.toml", ROOT / "tests" / "spaces" / "cli.toml", search={"knobs": ["repeat_scale"]}
    )
    db = tmp_path / "rs.db"
    # after the baseline, a first group of 3: the baseline (knob off) alone, the two residual maps fused
    enqueue = "2,1,1|repeat_scale=residual 1,2,1|repeat_scale=residual 2,1,1|repeat_scale=lr 2,1,1"
    cli(
        *run_args(
            space,
            db,
            "rs",
            *SMALL,
            "--fuse",
            "3",
            "--pruner",
            "none",
            "--enqueue",
            enqueue,
            budget="1.7x",
            steps=16,
            n_trials=6,
        ),
        check=True,
    )
    study = optuna.load_study(study_name="rs", storage=f"sqlite:///{db}")
    assert study.user_attrs["ilr:config"]["search"]["knobs"] == ["repeat_scale"]
    trials = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert all(set(t.params) == {"r0", "r1", "r2", "repeat_scale"} for t in trials)
    by_setting = {t.user_attrs["knobs"]["repeat_scale"]: t for t in trials if t.user_attrs["reuse_map"] == [2, 1, 1]}
    assert set(by_setting) == {"off", "residual", "lr"}
    assert len({t.user_attrs["val_ppl"] for t in by_setting.values()}) == 3  # each setting trains otherwise
    audit = run_audit(
        "rs", f"sqlite:///{db}", AuditSettings(factor=1.0, maps="all", seeds=1), checkpoint_dir=tmp_path / "ck"
    ).to_json()
    audited = {m["reuse_map"]: m["audit_ppl"] for m in audit["maps"]}
    for t in by_setting.values():
        # fused and single sum in another order: equal to ~1e-6 (tests/test_fused.py's tolerance)
        assert abs(audited[t.user_attrs["map_key"]] - t.user_attrs["val_ppl"]) < 1e-4 * t.user_attrs["val_ppl"], (
            t.number
        )
