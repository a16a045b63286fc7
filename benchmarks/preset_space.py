"""A preset space (ilr_search/search_spaces/NAME.toml) written to a file with overrides merged in: the benchmark
scripts that run studies (recurrence_forms.py, learned_schedule.py, routed_vs_fixed.py) make their spaces here."""

from __future__ import annotations

import json
from pathlib import Path

import tomllib

PRESETS = Path(__file__).resolve().parent.parent / "ilr_search" / "search_spaces"


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v)


def write_space(path: Path, preset: str, *overrides: dict) -> Path:
    """The preset's TOML with `overrides` merged in, table by table."""
    data = tomllib.loads((PRESETS / f"{preset}.toml").read_text(encoding="utf-8"))
    for o in overrides:
        for table, values in o.items():
            data.setdefault(table, {}).update(values)
    lines = []
    for table, values in data.items():
        lines += [f"[{table}]", *(f"{k} = {toml_value(v)}" for k, v in values.items()), ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
