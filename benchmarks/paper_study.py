"""The paper's small setup searched: a study of --n-trials maps under --budget, the paper's own maps first.

    python benchmarks/paper_study.py --workers 4 --storage sqlite:///studies/paper-small.db   # on a GPU

Space: search_spaces/paper-small-offline.toml (d_model 128, 4 layers, ctx 1024, batch 64, 600-step proxies,
embedded corpus, BPE 1024). The paper's nine reuse maps and the baseline are enqueued first (block K=2 is a
reference run of every study whose budget allows it), the sampler proposes the rest. The report compares the
study's front with the front of the paper's maps alone, under the same proxy, with the seed noise of the
baseline and the second seed of the best recurrent map.
"""

from __future__ import annotations

import argparse
import json

from ilr_search.space import load_space
from ilr_search.search.studies import list_trials
from ilr_search.cli.live import ConsoleReporter
from ilr_search.commands.workers import run_workers
from ilr_search.search.run import RunRequest

PAPER_MAPS = ((1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 1), (1, 1, 1, 2), (1, 1, 2, 4), (1, 2, 2, 3),
              (2, 2, 2, 2), (3, 2, 2, 1), (4, 2, 1, 1))


def front(rows: list[dict]) -> list[dict]:
    """Non-dominated rows by (flops_ratio, val_ppl), cheapest first."""
    rows = sorted(rows, key=lambda r: (r["flops_ratio"], r["val_ppl"]))
    out: list[dict] = []
    for r in rows:
        if not out or r["val_ppl"] < out[-1]["val_ppl"]:
            out.append(r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="paper-small-offline")
    ap.add_argument("--budget", default="2x")
    ap.add_argument("--n-trials", type=int, default=30)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--study", default="paper-small")
    ap.add_argument("--storage", default="sqlite:///studies/paper-small.db")
    ap.add_argument("--steps", type=int, default=None)
    args = ap.parse_args()

    space = load_space(args.space, {"train": {"steps": args.steps}})
    request = RunRequest(space, args.budget, args.study, args.storage, args.n_trials, enqueue_maps=PAPER_MAPS)
    with ConsoleReporter() as reporter:
        summary = run_workers(request, args.workers, reporter).to_json()
    rows = [r for r in list_trials(args.study, args.storage)
            if r["state"] == "COMPLETE" and r.get("val_ppl") and r.get("reused_from") is None]
    paper = [r for r in rows if tuple(r["reuse_map"]) in PAPER_MAPS]
    report = {
        "study": args.study, "n_trials": summary["n_trials"], "n_pruned": summary["n_pruned"],
        "front": front(rows), "paper_front": front(paper),
        "paper_maps": sorted(({"reuse_map": r["reuse_map"], "flops_ratio": r["flops_ratio"], "val_ppl": r["val_ppl"]}
                              for r in paper), key=lambda r: r["val_ppl"]),
        "pruned_paper_maps": [r["reuse_map"] for r in list_trials(args.study, args.storage)
                              if r["state"] == "PRUNED" and tuple(r["reuse_map"]) in PAPER_MAPS],
        "references": summary["references"], "fidelity": summary.get("fidelity", {}).get("verdict"),
    }
    print(json.dumps(report, default=float))


if __name__ == "__main__":
    main()
