"""The chaos scenario of tests/reliability/chaos.py, repeated: 3 workers on one study under a CPU hog, one
SIGKILLed before, during and after a claim wait, per repetition and storage.

    python benchmarks/soak.py --repeat 10                       # journal, sqlite, postgres
    python benchmarks/soak.py --repeat 3 --storages sqlite --postgres postgresql+psycopg://u@host/db
    python benchmarks/soak.py --repeat 6 --storages journal --hog 0 --fresh-cache   # as one test run meets it

--hog N: CPU-hog processes beside the workers (default: one per core; 0: none; a hog changes the timing, and
the journal lock defect of 2026-12-01 showed only without one). --fresh-cache: a new token cache per run, as a
pytest session has (the default shares one).

PostgreSQL: --postgres URL of a server whose user may CREATE DATABASE (a fresh database per repetition),
or else a throwaway local cluster is started as the tests do. Prints one row per storage: repetitions,
runs with any fault, and the totals of crashed survivors, lost finished trials, maps trained twice, trials
left RUNNING and stored fronts that differ from the recomputed front, with the median seconds per run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import traceback
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "reliability"), str(ROOT / "tests")]

from chaos import Chaos, CpuHog  # noqa: E402
from conftest import NO_REFERENCES, write_space  # noqa: E402


def postgres_database(server: str) -> str:
    import psycopg

    name = f"ilr_soak_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server.rsplit("/", 1)[0] + f"/{name}"


def one_run(backend: str, server: str | None, token_cache: Path, hog: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        storage = {"journal": f"journal:{folder / 'chaos.log'}", "sqlite": f"sqlite:///{folder / 'chaos.db'}"}.get(
            backend) or postgres_database(server)
        space = write_space(folder / "chaos.toml", model={"layers": 2, "d_model": 16, "seq_len": 32},
                            search={**NO_REFERENCES, "enqueue_paper_maps": False, "max_reuse": 3},
                            train={"checkpoint_every": 10, "eval_windows": 4})
        chaos = Chaos(storage, folder, space, token_cache)
        try:
            with CpuHog(hog) if hog else contextlib.nullcontext():
                r = chaos.run(timeout=300)
        except Exception:  # a scenario that could not finish (a timeout) is a fault too
            return {"error": traceback.format_exc(limit=2) + chaos.tails()[-3000:], "seconds": None}
        return {"crashed": len(r.crashed_survivors), "lost": len(r.lost_trials), "twice": len(r.trained_twice),
                "running": len(r.left_running), "front": int(r.front_mismatch), "kills": len(r.kills),
                "seconds": r.seconds, "details": r.crashed_survivors[:1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--storages", default="journal,sqlite,postgres")
    ap.add_argument("--postgres", default=None, help="server URL (default: a throwaway local cluster)")
    ap.add_argument("--hog", type=int, default=os.cpu_count() or 2, help="CPU-hog processes (0: none)")
    ap.add_argument("--fresh-cache", action="store_true", help="a new token cache per run")
    args = ap.parse_args()

    stop = None
    server = args.postgres
    if "postgres" in args.storages and not server:
        from pg import start_cluster

        server, stop = start_cluster()
    token_cache = Path(tempfile.mkdtemp(prefix="ilr-soak-cache-"))
    os.environ["ILR_SEARCH_CACHE"] = str(token_cache)
    rows = []
    try:
        for backend in args.storages.split(","):
            runs = []
            for i in range(args.repeat):
                cache = Path(tempfile.mkdtemp(prefix="ilr-soak-cache-")) if args.fresh_cache else token_cache
                runs.append(one_run(backend, server, cache, args.hog))
                print(json.dumps({"storage": backend, "run": i, **runs[-1]}), file=sys.stderr, flush=True)
            ok = [r for r in runs if "error" not in r]
            rows.append({"storage": backend, "runs": len(runs), "errors": len(runs) - len(ok),
                         "faulty_runs": sum(1 for r in ok if r["crashed"] or r["lost"] or r["twice"] or r["running"]
                                            or r["front"]) + len(runs) - len(ok),
                         **{k: sum(r[k] for r in ok) for k in ("crashed", "lost", "twice", "running", "front")},
                         "median_s": statistics.median(r["seconds"] for r in ok) if ok else None})
    finally:
        if stop:
            stop()
    print("| storage | runs | faulty runs | crashed survivors | lost finished trials | maps trained twice | "
          "left RUNNING | front mismatches | median s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['storage']} | {r['runs']} | {r['faulty_runs']} | {r['crashed']} | {r['lost']} | {r['twice']} | "
              f"{r['running']} | {r['front']} | {r['median_s'] or 0:.0f} |")


if __name__ == "__main__":
    main()
