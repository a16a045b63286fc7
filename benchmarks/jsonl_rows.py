"""The rows a benchmark appended to its JSON-lines file, one finished job a line (truth.py, fairness.py, wsd.py
resume from them): a torn last line, left by a killed run, is ignored. Run as `python benchmarks/<script>.py`,
a script finds this module beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_jsonl(jsonl: Path) -> list[dict[str, Any]]:
    rows = []
    if jsonl.exists():
        for line in jsonl.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows
