"""What people see: rich tables and progress bars, all on stderr except the tables they asked for."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

out = Console()
err = Console(stderr=True)


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    if isinstance(x, list):
        return ",".join(str(v) for v in x)
    return str(x)


def key_value_table(title: str, rows: dict[str, Any]) -> None:
    table = Table(title=title, show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    for key, value in rows.items():
        table.add_row(key, _fmt(value, 6))
    out.print(table)


def print_flops(report: dict[str, Any]) -> None:
    key_value_table("FLOPs", {k: v for k, v in report.items() if k != "schedule"} | {"schedule": report["schedule"]})


def print_train(report: dict[str, Any]) -> None:
    rows = {k: v for k, v in report.items() if k not in ("curve", "schedule")}
    key_value_table(f"proxy {_fmt(report['reuse_map'])}", rows)
    curve = Table(title="validation curve")
    for col in ("step", "tokens", "val_loss"):
        curve.add_column(col, justify="right")
    for p in report["curve"]:
        curve.add_row(str(p["step"]), str(p["tokens"]), f"{p['val_loss']:.4f}")
    out.print(curve)


def with_knobs_column(columns: list[str], rows: list[dict[str, Any]]) -> list[str]:
    """The columns, with `knobs` after `reuse_map` when some row has knobs on (a study that searches them)."""
    if not any(r.get("knobs") for r in rows) or "reuse_map" not in columns:
        return columns
    at = columns.index("reuse_map") + 1
    return columns[:at] + ["knobs"] + columns[at:]


def rows_table(title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
    columns = with_knobs_column(columns, rows)
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right" if col not in ("reuse_map", "knobs", "state", "study") else "left",
                         overflow="fold")  # names are never cut: they are what you copy
    for row in rows:
        table.add_row(*(_fmt(row.get(c)) for c in columns))
    out.print(table)


@contextmanager
def step_progress(enabled: bool = True, total: int | None = None, description: str = "train") -> Iterator[Any]:
    """A progress bar of training steps with the loss and an ETA; yields an on_step(step, loss) callback."""
    if not enabled:
        yield None
        return
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), TextColumn("eta"),
                        TimeRemainingColumn(), console=err, transient=True)
    task = progress.add_task(description, total=total, loss="-")

    def on_step(step: int, steps: int, loss: float) -> None:
        progress.update(task, completed=step, total=steps, loss=f"{loss:.3f}")

    with progress:
        yield on_step


FRONT_COLUMNS = ["trial", "reuse_map", "flops_ratio", "val_ppl", "val_bpb"]
TRIAL_COLUMNS = ["trial", "state", "reuse_map", "flops_ratio", "val_ppl", "val_bpb", "steps", "pruned_at_step"]


class RichReporter:
    """Study progress (trials, ETA) and trial progress (steps, loss) on stderr; the front after each trial."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("eta"),
                                 TimeRemainingColumn(), console=err, disable=not enabled)
        self.study_task = None
        self.trial_task = None

    def __enter__(self) -> "RichReporter":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def study_started(self, study: str, target: int, finished: int) -> None:
        self.progress.console.print(f"study {study}: {finished} of {target} trials finished")
        self.study_task = self.progress.add_task("study", total=target, completed=finished, info="trials")

    def trial_started(self, number: int, reuse_map: list[int], steps: int, knobs: str = "") -> None:
        if self.trial_task is not None:
            self.progress.remove_task(self.trial_task)
        self.progress.console.print(f"trial {number}: training map {_fmt(reuse_map)}" + (f" with {knobs}" if knobs else ""))
        self.trial_task = self.progress.add_task(f"trial {number}", total=steps, info="loss -")

    def step(self, step: int, steps: int, loss: float) -> None:
        if self.trial_task is not None:
            self.progress.update(self.trial_task, completed=step, total=steps, info=f"loss {loss:.3f}")

    def trial_finished(self, row: dict[str, Any], front: list[dict[str, Any]], finished: int, who: str = "") -> None:
        if self.study_task is not None:
            self.progress.update(self.study_task, completed=finished)
        if not self.enabled:
            return
        self.progress.console.print(
            f"{who}trial {row['trial']} {row['state'].lower()}: map {_fmt(row['reuse_map'])}"
            + (f" with {row['knobs']}" if row.get("knobs") else "") + f", {_fmt(row['flops_ratio'])}x, "
            f"ppl {_fmt(row['val_ppl'])}" + (f" (reused trial {row['reused_from']})" if row.get("reused_from") is not None else "")
            + (f" ({row['reason']})" if row["state"] != "COMPLETE" and row.get("reason") else ""))
        if not front:
            return
        table = Table(title="current front", title_justify="left")
        columns = with_knobs_column(FRONT_COLUMNS, front)
        for col in columns:
            table.add_column(col)
        for p in front:
            table.add_row(*(_fmt(p.get(c)) for c in columns))
        self.progress.console.print(table)

    def message(self, text: str) -> None:
        if self.enabled:
            self.progress.console.print(text)


class WorkersReporter(RichReporter):
    """`run --workers N`: one progress row per worker (its trial, map, steps and loss) under the study's row;
    finished trials and messages are printed with the worker's number."""

    def __init__(self, enabled: bool = True) -> None:
        super().__init__(enabled)
        self.worker_tasks: dict[int, Any] = {}

    def worker_study_started(self, worker: int, study: str, target: int, finished: int) -> None:
        if self.study_task is None:
            self.study_started(study, target, finished)
        self.worker_tasks[worker] = self.progress.add_task(f"worker {worker}", total=1, info="starting")

    def worker_trial_started(self, worker: int, number: int, reuse_map: list[int], steps: int, knobs: str = "") -> None:
        task = self.worker_tasks.get(worker)
        if task is not None:
            label = f"trial {number} map {_fmt(reuse_map)}" + (f" with {knobs}" if knobs else "")
            self.progress.update(task, completed=0, total=steps, info=label)

    def worker_step(self, worker: int, step: int, steps: int, loss: float) -> None:
        task = self.worker_tasks.get(worker)
        if task is not None:
            info = self.progress.tasks[task].fields["info"].split(" loss ")[0]
            self.progress.update(task, completed=step, total=steps, info=f"{info} loss {loss:.3f}")

    def worker_trial_finished(self, worker: int, row: dict[str, Any], front: list[dict[str, Any]], finished: int) -> None:
        self.trial_finished(row, front, finished, who=f"worker {worker}: ")

    def worker_message(self, worker: int, text: str) -> None:
        self.message(f"worker {worker}: {text}")

    def study_started(self, study: str, target: int, finished: int) -> None:
        if self.study_task is None:
            super().study_started(study, target, finished)


def print_run(summary: dict[str, Any]) -> None:
    rows_table(f"Pareto front of {summary['study']}", summary["pareto"], FRONT_COLUMNS)
    for name, ref in summary.get("references", {}).items():
        out.print(f"reference {name}: {_fmt(ref['flops_ratio'])}x, ppl {_fmt(ref['val_ppl'])}")
    out.print(f"{summary['n_complete']} complete, {summary['n_pruned']} pruned, {summary['n_failed']} failed; "
              f"{summary['steps_trained']} steps trained, {summary['steps_saved_by_pruning']} saved by pruning; "
              f"storage {summary['storage']}")
    _fidelity_lines(summary.get("fidelity"))
    if summary.get("interrupted"):
        out.print("interrupted: finished trials are saved; run the same command again to resume")


def print_studies(report: dict[str, Any]) -> None:
    rows_table("studies", report["studies"], ["study", "n_trials", "n_complete", "budget", "layers", "best_val_ppl"])


def print_trials(report: dict[str, Any]) -> None:
    rows_table(f"trials of {report['study']}", report["trials"], TRIAL_COLUMNS)
    _fidelity_lines(report.get("fidelity"))


def print_pareto(report: dict[str, Any]) -> None:
    noise = report.get("noise")
    rows = [dict(p, ties=("≈ " + ",".join(map(str, p["within_noise_of"]))) if p.get("within_noise_of") else "")
            for p in report["pareto"]]
    rows_table(f"Pareto front of {report['study']}", rows, FRONT_COLUMNS + ["params", "ties"])
    if noise:
        out.print(f"baseline seed-to-seed spread: {noise['spread']:.4g} ppl over {noise['n_seeds']} seeds; "
                  "points marked ≈ are within it of each other (a tie, not a win)")
    layers = report.get("layers")
    if layers and layers.get("importance"):
        rows_table("layer importance for perplexity (Optuna PED-ANOVA)",
                   [{"layer": k, "importance": v} for k, v in layers["importance"].items()], ["layer", "importance"])
    _fidelity_lines(report.get("fidelity"))
    if report.get("out"):
        out.print(f"wrote {report['out']}")


def _fidelity_lines(fidelity: dict[str, Any] | None) -> None:
    if not fidelity:
        return
    rungs = fidelity.get("rungs") or []
    if rungs:
        rows_table("rung agreement with the final ranking (complete maps)",
                   [{"step": r["step"], "fraction": r["fraction"], "maps": r["n_maps"], "spearman": r["spearman"],
                     "kendall": r["kendall"]} for r in rungs], ["step", "fraction", "maps", "spearman", "kendall"])
    out.print(f"fidelity: {fidelity['verdict']}")


def print_audit(report: dict[str, Any]) -> None:
    rows = [{"reuse_map": m["reuse_map"], "flops_ratio": m["flops_ratio"], "proxy": m["proxy_state"].lower(),
             "proxy_ppl": m["proxy_ppl"], f"{report['factor']:g}x_ppl": m["audit_ppl"],
             "front": ("proxy " if m["on_proxy_front"] else "") + (f"{report['factor']:g}x" if m["on_audit_front"] else "")}
            for m in sorted(report["maps"], key=lambda m: m["audit_ppl"])]
    rows_table(f"audit of {report['study']}: {report['proxy_steps']} -> {report['steps']} steps",
               rows, ["reuse_map", "flops_ratio", "proxy", "proxy_ppl", f"{report['factor']:g}x_ppl", "front"])
    out.print(f"Spearman {_fmt(report['spearman'])}, Kendall {_fmt(report['kendall'])} over {report['n_maps']} maps; "
              f"front precision {_fmt(report['front_precision'])}, recall {_fmt(report['front_recall'])}; pruned maps on the "
              f"{report['factor']:g}x front: {', '.join(report['pruned_on_audited_front']) or 'none'}")
    out.print(f"verdict: {report['verdict']}")


def print_policy_replay(report: dict[str, Any]) -> None:
    rows_table(f"policy {report['policy']} over {report['table']} ({report['maps']} maps, {report['base_steps']} to "
               f"{report['target_steps']} steps, {report['orders']} orders)",
               [{"order": r["order_seed"], "seeds": ",".join(map(str, r["seeds"])), "compute": r["compute_steps"],
                 "claimed": ", ".join(r["claimed"]) or "-", "false": ", ".join(r["false_claims"]) or "-",
                 "best": r["best"], "regret_sd": r["regret_sd"]} for r in report["replays"]],
               ["order", "seeds", "compute", "claimed", "false", "best", "regret_sd"])
    coverage = report["interval_coverage"]
    out.print(f"mean compute {report['mean_compute_steps']:.0f} steps (every table result: {report['exhaustive_steps']}); "
              f"claims {report['maps_claimed']}, false {report['false_claims']} ({report['false_claim_share']:.0%}); "
              f"regret within 1 seed sd in "
              f"{'-' if report['regret_within_1sd_share'] is None else format(report['regret_within_1sd_share'], '.0%')}"
              f" of orders (mean {_fmt(report['mean_regret_sd'])} sd); intervals holding the table mean: "
              + ("n/a" if coverage is None else f"{coverage:.0%} of {report['intervals']}"))
    out.print(f"first order's verdict: {report['replays'][0]['verdict']}")


def print_pruning_replay(report: dict[str, Any]) -> None:
    rows_table(f"{report['rule']} over {report['table']} ({report['n_rows']} rows, "
               f"{'table order' if report['order_seed'] is None else 'order seed ' + str(report['order_seed'])})",
               [{"reuse_map": p["reuse_map"], "step": p["step"], "flops_ratio": p["flops_ratio"],
                 "front": "LOST" if p["reuse_map"] in report["front_maps_lost"] else ""} for p in report["pruned"]],
               ["reuse_map", "step", "flops_ratio", "front"])
    out.print(f"pruned {len(report['pruned'])} of {report['n_rows']} maps at rungs {list(report['rungs'])}; "
              f"steps saved {report['steps_saved']} ({report['steps_saved_share']:.1%}); table front "
              f"{', '.join(report['front'])}; front maps lost: {', '.join(report['front_maps_lost']) or 'none'}")
