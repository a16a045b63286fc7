"""The JSON of one run of benchmarks/released_model_newcomer.sh, read from the logs it wrote.

    python benchmarks/released_model_newcomer.py LOGS COMMIT [--out benchmarks/data/released-model-newcomer-DATE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # not recorded


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("logs", type=Path)
    ap.add_argument("commit")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    times = dict(line.split(" ", 1) for line in (args.logs / "times").read_text().splitlines())
    err = (args.logs / "run.err").read_text()
    out = (args.logs / "run.out").read_text()
    answer = next(line for line in (out + err).splitlines() if line.startswith(("no map beat", "use ")))
    started = times["start"].split()[0]
    report = {
        "script": "benchmarks/released_model_newcomer.sh",
        "commit": args.commit,
        "started_utc": started,
        "load_at_start": _number(times["start"].split()[-1]),
        "cores": os.cpu_count(),
        "install_seconds": int(times["installed"]),
        "run_seconds": int(times["ran"]) - int(times["installed"]),
        "export_seconds": int(times["exported"]) - int(times["ran"]),
        "total_seconds": int(times["exported"]),
        "run_cpu_percent": int(re.search(r"Percent of CPU this job got: (\d+)%", err).group(1)),
        "run_peak_rss_kib": int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1)),
        "maps_evaluated": int(re.search(r"(\d+) evaluated, \d+ failed", out).group(1)),
        "answer": answer,
        "export": (args.logs / "export.out").read_text().strip().splitlines()[-1],
    }
    path = args.out or Path(__file__).resolve().parent / "data" / f"released-model-newcomer-{started[:10]}.json"
    path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
