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


def rows_table(title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right" if col not in ("reuse_map", "state", "study") else "left")
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
