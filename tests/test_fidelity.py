"""How far a proxy can be trusted: rung agreement, the calibrated pruning rule, pruning replays over tables in
the bench format, and the audit (store, claims, resume, bad input)."""

import hashlib
import json
import math
import sqlite3

import optuna
import pandas as pd
import pytest
from conftest import ROOT
from replays.hypervolume import table_entries

from ilr_search.analysis.fidelity import audit_report, rung_agreements
from ilr_search.analysis.results import study_front
from ilr_search.commands.audit import check_settings, run_audit
from ilr_search.commands.bench import Table, TableRow, replay_pruning
from ilr_search.config import PrunerSettings, factor_key
from ilr_search.errors import UserInputError
from ilr_search.options import AuditSettings
from ilr_search.search.pruners import calibrate_rung, decision_at_rung, pareto_decision
from ilr_search.search.run import RunRequest, run_in_process
from ilr_search.search.studies import list_trials, trials_report
from ilr_search.space import load_space
from ilr_search.storage import CurvePoint, JournalStore, Run, RunJob, SQLStore, open_store, parse_storage
from ilr_search.storage.trials import told_trials

SPACE = ROOT / "tests" / "spaces" / "tiny.toml"


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------------------------------
# Rung agreement and calibration on hand-made curves


def test_rung_agreement_on_hand_made_curves():
    curves = {  # rung 10 runs backwards, rung 20 agrees, rung 30 has one swap
        "a": {10: 3.0, 20: 2.0, 30: 1.6, 40: 1.0},
        "b": {10: 2.8, 20: 2.1, 30: 1.5, 40: 1.1},
        "c": {10: 2.6, 20: 2.2, 30: 1.7, 40: 1.2},
        "d": {10: 2.4, 20: 2.3, 30: 1.8, 40: 1.3},
        "pruned": {10: 9.0, 20: 9.0},  # never reached the end: not counted
    }
    by_step = {r.step: r for r in rung_agreements(curves, 40)}
    assert set(by_step) == {10, 20, 30}
    assert all(r.n_maps == 4 for r in by_step.values())
    assert by_step[10].spearman == pytest.approx(-1.0) and by_step[10].kendall == pytest.approx(-1.0)
    assert by_step[20].spearman == pytest.approx(1.0) and by_step[20].kendall == pytest.approx(1.0)
    assert by_step[30].spearman == pytest.approx(0.8) and by_step[30].kendall == pytest.approx(4 / 6)
    assert by_step[20].fraction == 0.5
    two = rung_agreements({"a": {1: 1.0, 2: 1.0}, "b": {1: 2.0, 2: 2.0}}, 2)
    assert two[0].spearman is None and two[0].n_maps == 2  # too few maps to rank


def test_calibration_margin_is_the_largest_overturned_lead():
    # (rung loss, final loss): c trailed b by 0.3 and a by 0.5 at the rung, and beat both at the end
    pairs = [(2.0, 1.5), (2.2, 1.4), (2.5, 1.3), (3.0, 2.0)]
    cal = calibrate_rung(10, pairs)
    assert cal.n_maps == 4 and cal.margin == pytest.approx(0.5)
    assert calibrate_rung(10, [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)]).margin == 0.0


# ----------------------------------------------------------------------------------------------------
# The calibrated rule keeps a map whose curve crosses the others late


def crossing_table() -> Table:
    """Eight maps with four evaluations of a 160-step proxy. The recurrent maps (dearer) start slower and end
    ahead; `late` is the slowest starter and the best map at the end; `bad` is bad throughout."""

    def row(key, ratio, losses):
        return TableRow(
            key,
            tuple(int(x) for x in key.split(",")),
            ratio,
            math.exp(losses[-1]),
            dict(zip((20, 40, 80, 160), losses, strict=True)),
        )

    rows = [
        row("1,1,1,1", 1.00, [3.00, 2.50, 2.20, 2.00]),
        row("2,1,1,1", 1.25, [3.20, 2.65, 2.25, 1.98]),
        row("1,2,1,1", 1.25, [3.25, 2.70, 2.28, 1.99]),
        row("2,2,1,1", 1.50, [3.40, 2.80, 2.30, 1.95]),
        row("1,1,2,2", 1.50, [3.45, 2.85, 2.32, 1.96]),
        row("1,1,1,2", 1.25, [3.10, 2.60, 2.30, 2.05]),
        row("3,3,1,1", 2.00, [3.90, 3.20, 2.45, 1.90]),  # late: the best at the end
        row("1,1,1,3", 1.50, [3.60, 3.10, 2.80, 2.60]),  # bad throughout
    ]
    return Table(4, 3, 8, 160, (20, 40, 80), tuple(rows))


def test_the_calibrated_rule_keeps_a_late_crossing_map_the_eager_rule_prunes():
    table = crossing_table()
    assert table.front_keys()[-1] == "3,3,1,1"
    eager = replay_pruning(
        table, PrunerSettings(name="pareto-eager", eta=3, epsilon=0.0, warmup=3), rung_fractions=(0.125, 0.25, 0.5)
    )
    assert "3,3,1,1" in eager.front_maps_lost  # the old rule discards the map the search exists to find
    safe = replay_pruning(
        table,
        PrunerSettings(name="pareto", eta=3, epsilon=0.0, calibration_maps=3, min_spearman=0.6),
        rung_fractions=(0.125, 0.25, 0.5),
    )
    assert safe.front_maps_lost == []
    assert "3,3,1,1" not in [p.reuse_map for p in safe.pruned]


def test_the_calibrated_rule_prunes_where_the_rung_predicts_the_end():
    # the rung agrees with the end over the calibration maps; a map far behind a cheaper one is pruned there
    points = [
        CurvePoint(i, s, loss + 0.1 * i, 1.0 + 0.1 * i, f"m{i}") for i in range(4) for s, loss in ((10, 2.0), (20, 1.5))
    ]
    settings = PrunerSettings(name="pareto", rungs=(10,), eta=3, epsilon=0.0, calibration_maps=4, min_spearman=0.6)
    far = CurvePoint(9, 10, 4.0, 2.0, "far")
    decision = decision_at_rung(far, points + [far], 20, settings)
    assert not decision.keep and "margin" in decision.reason and decision.dominated_by
    close = CurvePoint(9, 10, 2.05, 2.0, "close")  # within the best third: kept
    assert decision_at_rung(close, points + [close], 20, settings).keep
    few = PrunerSettings(name="pareto", rungs=(10,), calibration_maps=5)
    assert "calibrating" in decision_at_rung(far, points + [far], 20, few).reason
    # a rung that ranks backwards never prunes
    backwards = [
        CurvePoint(i, s, loss - 0.1 * i if s == 10 else loss + 0.1 * i, 1.0, f"m{i}")
        for i in range(4)
        for s, loss in ((10, 2.0), (20, 1.5))
    ]
    kept = decision_at_rung(far, backwards + [far], 20, settings)
    assert kept.keep and "does not predict" in kept.reason


def test_replay_reads_a_partial_table_with_a_block_row(tmp_path):
    rows = [
        {
            "reuse_map": r.map_key,
            "flops_ratio": r.flops_ratio,
            "val_ppl": r.val_ppl,
            "curve": json.dumps(sorted(r.curve.items())),
            "steps": 160,
        }
        for r in crossing_table().rows
    ]
    rows.append(
        {
            "reuse_map": "block2",
            "flops_ratio": 2.0,
            "val_ppl": math.exp(1.97),
            "curve": json.dumps([[20, 3.5], [40, 2.9], [80, 2.4], [160, 1.97]]),
            "steps": 160,
        }
    )
    path = tmp_path / "partial.csv"
    pd.DataFrame(rows).to_csv(path, index=False)  # no meta column: steps and rungs come from the rows
    table = Table.read(path)
    assert table.steps == 160 and table.rungs == (20, 40, 80) and len(table.rows) == 9
    assert len(table_entries(table)) == 8  # the block row is not a reuse map
    a = replay_pruning(table, PrunerSettings(name="pareto-eager", warmup=3), order_seed=1)
    b = replay_pruning(table, PrunerSettings(name="pareto-eager", warmup=3), order_seed=1)
    assert a.to_dict() == b.to_dict() and a.n_rows == 9
    assert a.steps_trained + a.steps_saved == 9 * 160
    assert [r.map_key for r in table.rows] != [p.reuse_map for p in a.pruned] or a.pruned == []


def test_eager_rule_is_unchanged():
    peers = [CurvePoint(i, 10, 2.0 + 0.01 * i, 1.0, f"m{i}") for i in range(5)]
    me = CurvePoint(9, 10, 3.0, 1.5, "me")
    assert not pareto_decision(me, peers + [me], 3.0, 0.0, 3).keep


# ----------------------------------------------------------------------------------------------------
# The audit


@pytest.fixture(scope="module")
def small_study(tmp_path_factory, token_cache):
    root = tmp_path_factory.mktemp("audit")
    db = root / "a.db"
    space = load_space(  # a narrow model: the fidelity and audit checks need no size
        SPACE,
        {
            "search": {"noise_seeds": 0, "families": ["ilr"], "prune_calibration_maps": 3},
            "train": {"steps": 16},
            "model": {"d_model": 16, "seq_len": 32},
        },
    )
    summary = run_in_process(
        RunRequest(space, "2x", "aud", f"sqlite:///{db}", n_trials=6, sampler="random", checkpoint_dir=root / "ck")
    ).to_json()
    assert summary["pruner"] == "pareto"  # the calibrated default, live
    return root, db, summary


@pytest.mark.slow
def test_run_summary_and_trials_carry_fidelity(small_study):
    root, db, summary = small_study
    fidelity = summary["fidelity"]
    assert [r["step"] for r in fidelity["rungs"]] == [4, 8]
    assert all(r["n_maps"] >= 3 for r in fidelity["rungs"])
    with sqlite3.connect(db) as conn:
        reasons = [r[0] for r in conn.execute("SELECT reason FROM ilr_pruning")]
    assert all("margin" in r and "Spearman" in r for r in reasons)  # pruned only at a calibrated rung
    assert "not audited" in fidelity["verdict"]
    # read from the stored curves every time: nothing large is kept in Optuna's study attributes
    assert "ilr:fidelity" not in optuna.load_study(study_name="aud", storage=f"sqlite:///{db}").user_attrs
    assert trials_report("aud", f"sqlite:///{db}").to_json()["fidelity"]["rungs"] == fidelity["rungs"]


@pytest.mark.parametrize(
    "settings, message",
    [
        (AuditSettings(factor=0.5), "--factor"),
        (AuditSettings(factor=float("nan")), "--factor"),
        (AuditSettings(seeds=0), "--seeds"),
        (AuditSettings(maps="top:0"), "--maps"),
        (AuditSettings(maps="best"), "--maps"),
    ],
)
def test_bad_audit_settings_are_refused_before_anything_opens(settings, message):
    with pytest.raises(UserInputError, match=message):
        check_settings(settings)


@pytest.mark.slow
def test_bad_audit_input_leaves_the_database_byte_identical(small_study, tmp_path):
    root, db, _ = small_study
    before = digest(db)
    with pytest.raises(UserInputError, match="no study 'nope'"):
        run_audit("nope", f"sqlite:///{db}")
    with pytest.raises(UserInputError, match="--factor"):
        run_audit("aud", f"sqlite:///{db}", AuditSettings(factor=0.9))
    assert digest(db) == before
    # a study with no complete trial
    empty_db = tmp_path / "e.db"
    study = optuna.create_study(study_name="empty", storage=f"sqlite:///{empty_db}")
    study.set_user_attr("ilr:config", {"train": {"steps": 10}})
    before = digest(empty_db)
    with pytest.raises(UserInputError, match="no complete trial"):
        run_audit("empty", f"sqlite:///{empty_db}")
    assert digest(empty_db) == before


@pytest.mark.slow
def test_audit_stores_runs_resumes_and_reports(small_study, tmp_path):
    root, db, _ = small_study
    storage = f"sqlite:///{db}"
    settings = AuditSettings(factor=1.5, maps="top:3", seeds=1)
    first = run_audit("aud", storage, settings, checkpoint_dir=tmp_path / "ck").to_json()
    assert first["steps"] == 24 and first["runs"] == 3 and first["trained_by_this_worker"] == 3
    assert first["n_maps"] == 3 and first["spearman"] is not None and first["verdict"]
    rows = open_store(parse_storage(storage), "aud").race_runs()
    assert len(rows) == 3 and all(r.state == "complete" and r.curve[-1][0] == 24 for r in rows)
    again = run_audit("aud", storage, settings, checkpoint_dir=tmp_path / "ck").to_json()
    assert again["trained_by_this_worker"] == 0  # resumed: everything was done
    assert again["maps"] == first["maps"] and again["verdict"] == first["verdict"]
    report = trials_report("aud", storage).to_json()
    assert report["fidelity"]["verdict"].startswith("audit: ")
    assert list_trials("aud", storage) == report["trials"] != []  # the Python API's rows are `trials --json`'s
    assert not list((tmp_path / "ck").rglob("*.pt"))  # checkpoints go when their runs end


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_audit_claims_are_exclusive_and_dead_workers_are_taken_over(kind, tmp_path):
    if kind == "sqlite":
        import sqlalchemy as sa

        store = SQLStore(sa.create_engine(f"sqlite:///{tmp_path / 'c.db'}"), "s")
    else:
        store = JournalStore(str(tmp_path / "j.log"), "s")
    job = RunJob("4", 0, "2,1,1,1")
    assert store.claim_run("race", job, "w1", 1.2, 100, stale_after=60)
    assert not store.claim_run("race", job, "w2", 1.2, 100, stale_after=60)  # held by a live worker
    assert store.claim_run("race", job, "w2", 1.2, 100, stale_after=0)  # w1's heartbeat is stale: taken over
    assert not store.finish_run("race", job, "w1", "complete", 1.0, 2.7, 1.1, [(100, 1.0)], 1.0, "")  # w1 lost it
    assert store.finish_run("race", job, "w2", "complete", 1.0, 2.7, 1.1, [(100, 1.0)], 1.0, "")
    assert not store.claim_run("race", job, "w3", 1.2, 100, stale_after=0)  # complete: never trained again
    (row,) = store.race_runs()
    assert row.state == "complete" and row.worker == "w2" and row.curve == ((100, 1.0),)
    other = RunJob("4", 0, "1,1,1,1")
    assert store.claim_run("race", other, "w1", 1.0, 100, stale_after=60)
    store.finish_run("race", other, "w1", "interrupted", None, None, None, [], 0.0, "interrupted")
    assert store.claim_run("race", other, "w2", 1.0, 100, stale_after=60)  # interrupted: free at once


@pytest.mark.slow
def test_audit_report_precision_recall_and_pruned_maps(small_study):
    root, db, _ = small_study
    study = optuna.load_study(study_name="aud", storage=f"sqlite:///{db}")
    trials = study.get_trials()
    records = told_trials(study)
    from ilr_search.storage import Run

    keys = [
        t.user_attrs["map_key"]
        for t in trials
        if t.state == optuna.trial.TrialState.COMPLETE and "reused_from" not in t.user_attrs
    ]
    ratio = {t.user_attrs["map_key"]: t.user_attrs["flops_ratio"] for t in trials}
    # the audit reverses the proxy's order exactly
    proxy = {t.user_attrs["map_key"]: t.user_attrs["val_ppl"] for t in trials if t.user_attrs.get("val_ppl")}
    ordered = sorted(keys, key=lambda k: proxy[k])
    rows = [
        Run("race", k, "4", 0, "complete", ratio[k], 64, "w", 0.0, 1.0, 10.0 + i, 1.0)
        for i, k in enumerate(reversed(ordered))
    ]
    report = audit_report(records, rows, "4")
    assert report.n_maps == len(keys) and report.spearman == pytest.approx(-1.0)
    assert report.finding.startswith("proxy too short")
    # the fronts by hand: a map is on the audit's front when no map at no more FLOPs has a lower 4x perplexity
    audit_ppl = {k: 10.0 + i for i, k in enumerate(reversed(ordered))}
    audit_front = {
        k
        for k in keys
        if not any(
            audit_ppl[j] <= audit_ppl[k]
            and ratio[j] <= ratio[k]
            and (audit_ppl[j], ratio[j]) != (audit_ppl[k], ratio[k])
            for j in keys
        )
    }
    numbers = {t.number: t.user_attrs["map_key"] for t in trials}
    proxy_front = {numbers[p.trial] for p in study_front(records)}
    hits = len(proxy_front & audit_front)
    assert audit_front and proxy_front
    assert report.front_recall == pytest.approx(hits / len(audit_front))
    assert report.front_precision == pytest.approx(hits / len(proxy_front))
    assert report.pruned_on_audited_front == ()


@pytest.mark.slow
@pytest.mark.parametrize("separated", [True, False])
def test_an_audit_whose_runs_do_not_separate_the_maps_does_not_judge_the_proxy(small_study, separated):
    """Three seeds per map at 4x, in the proxy's reverse order: far apart (the proxy is judged too short), or each
    map's seeds spread far wider than the gaps between maps (the 4x ranking is noise: the proxy is not judged)."""
    root, db, _ = small_study
    study = optuna.load_study(study_name="aud", storage=f"sqlite:///{db}")
    trials = study.get_trials()
    from ilr_search.storage import Run

    proxy = {
        t.user_attrs["map_key"]: t.user_attrs["val_ppl"]
        for t in trials
        if t.state == optuna.trial.TrialState.COMPLETE and "reused_from" not in t.user_attrs
    }
    ratio = {t.user_attrs["map_key"]: t.user_attrs["flops_ratio"] for t in trials}
    ordered = sorted(proxy, key=lambda k: proxy[k])
    gap, spread = (1.0, 0.01) if separated else (0.01, 1.0)
    rows = [
        Run("race", k, "4", seed, "complete", ratio[k], 64, "w", 0.0, 1.0, 10.0 + gap * i + spread * (seed - 1), 1.0)
        for i, k in enumerate(reversed(ordered))
        for seed in range(3)
    ]
    report = audit_report(told_trials(study), rows, "4")
    assert report.maps_with_seeds == len(proxy) >= 3 and report.spearman == pytest.approx(-1.0)
    if separated:
        assert report.maps_differ_p < 0.01 and report.finding.startswith("proxy too short")
    else:
        assert report.maps_differ_p > 0.9 and report.finding.startswith("the 4x runs do not tell")
        assert "proxy too short" not in report.finding


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """The real console entry point, in-process."""
    from ilr_search.cli.main import main

    monkeypatch.setattr("sys.argv", ["ilr-search", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ["--study", "aud", "--factor", "0.5"],
        ["--study", "nope"],
        ["--study", "aud", "--maps", "top:x"],
        ["--study", "aud", "--seeds", "0"],
    ],
)
def test_audit_cli_bad_input_is_one_error_line(small_study, monkeypatch, capsys, args):
    root, db, _ = small_study
    before = digest(db)
    code, out, err = run_cli(monkeypatch, capsys, "audit", "--storage", f"sqlite:///{db}", *args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert digest(db) == before


@pytest.mark.slow
def test_reading_commands_without_study_use_the_only_one(small_study, monkeypatch, capsys):
    root, db, _ = small_study
    before = digest(db)
    code, out, err = run_cli(monkeypatch, capsys, "trials", "--storage", f"sqlite:///{db}", "--json")
    assert code == 0 and json.loads(out)["study"] == "aud" and "the only study" in err
    code, out, err = run_cli(monkeypatch, capsys, "pareto", "--storage", f"sqlite:///{db}", "--json")
    assert code == 0 and "fidelity" in json.loads(out)
    assert digest(db) == before  # reading commands write nothing


def test_bench_replay_cli(monkeypatch, capsys, tmp_path):
    code, out, err = run_cli(
        monkeypatch,
        capsys,
        "bench",
        "replay",
        "--table",
        str(ROOT / "benchmarks" / "data" / "bench-small.parquet"),
        "--seed",
        "1",
        "--json",
    )
    report = json.loads(out)
    assert code == 0 and report["n_rows"] == 50 and report["rule"] == "pareto" and report["front_maps_lost"] == []
    assert report["steps_trained"] + report["steps_saved"] == 50 * 240
    code, out, err = run_cli(monkeypatch, capsys, "bench", "replay", "--table", str(tmp_path / "none.parquet"))
    assert code == 2 and err.startswith("error: ")


@pytest.mark.slow
@pytest.mark.parametrize("recurrent_losses, beats", [((1.00, 1.01, 0.99), True), ((0.90, 1.20, 0.95), False)])
def test_audit_says_a_map_beats_the_baseline_only_beyond_the_seed_noise(small_study, recurrent_losses, beats):
    """The audit's verdict on recurrence rests on a paired test over seeds, not on the means alone: a map whose
    mean is lower but whose seeds scatter across the baseline's is reported as within the noise."""
    root, db, _ = small_study
    study = optuna.load_study(study_name="aud", storage=f"sqlite:///{db}")
    trials = study.get_trials()
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and "reused_from" not in t.user_attrs]
    baseline = next(t for t in complete if set(t.user_attrs["reuse_map"]) == {1})
    recurrent = next(t for t in complete if set(t.user_attrs["reuse_map"]) != {1})
    rows = []
    for seed, (b, r) in enumerate(zip((1.10, 1.11, 1.09), recurrent_losses, strict=True)):
        for t, loss in ((baseline, b), (recurrent, r)):
            rows.append(
                Run(
                    "race",
                    t.user_attrs["map_key"],
                    "4",
                    seed,
                    "complete",
                    t.user_attrs["flops_ratio"],
                    64,
                    "w",
                    0.0,
                    loss,
                    math.exp(loss),
                    1.0,
                )
            )
    report = audit_report(told_trials(study), rows, "4")
    assert report.best_vs_baseline_seeds == 3 and report.best_beats_baseline is beats
    assert ("beats the baseline" in report.finding) is beats
    assert ("not beyond the seed noise" in report.finding) is not beats


@pytest.mark.slow
def test_audit_fused_gives_the_runs_one_at_a_time_gives(small_study, tmp_path):
    """audit --fuse 3 trains the chosen maps and seeds in fused groups: the same rows, the same curves within the
    fused trainer's tolerance, as one run at a time on a copy of the same study."""
    import shutil

    root, db, _ = small_study
    settings = AuditSettings(factor=1.25, maps="top:3", seeds=2)  # a factor no other test audits
    rows = {}
    for fuse in (1, 3):
        copy = tmp_path / f"fuse{fuse}.db"
        shutil.copy(db, copy)
        report = run_audit("aud", f"sqlite:///{copy}", settings, checkpoint_dir=tmp_path / f"ck{fuse}", fuse=fuse)
        assert report.trained_by_this_worker == 6
        rows[fuse] = {
            r.job: r
            for r in open_store(parse_storage(f"sqlite:///{copy}"), "aud").race_runs()
            if r.job.factor == factor_key(settings.factor)
        }
    assert set(rows[1]) == set(rows[3]) and len(rows[1]) == 6
    for job, single in rows[1].items():
        fused = rows[3][job]
        assert fused.state == single.state == "complete"
        assert [s for s, _ in fused.curve] == [s for s, _ in single.curve]
        assert all(abs(a - b) <= 1e-4 for (_, a), (_, b) in zip(fused.curve, single.curve, strict=True)), job
