"""Does each recurrence knob change the best map's perplexity, and does `ilr-search audit` confirm it at 4x?

    python benchmarks/knobs.py                    # bench-crossing's space, its best map 3,2,1,1, budget 2x
    python benchmarks/knobs.py --space default --map 2,2,1,1,1,1,1,1 --budget 1.5x

Two studies of the space (seeds 0 and 1, run side by side) search all four knobs; each is given the same
seven configurations through Optuna's queue (no sampling, no pruning): the all-ones baseline and the best map
with every knob off, then the best map with one knob on at a time. `ilr-search audit --maps all --seeds 2
--factor 4` then retrains every configuration of the seed-0 study at 4x the proxy's steps at seeds 0 and 1
(two audit processes share the work through the audit's claims).

Per knob it reports the mean over the two seeds of (ppl with the knob - ppl with every knob off), at the
proxy's length and at 4x. A difference within the seed-to-seed spread of the knobs-off map at that length
(two seeds: a weak yardstick) counts as no effect; otherwise the knob is better or worse there. The audit
confirms the proxy when both say the same, reverses it when they disagree in sign, and otherwise finds an effect
the proxy missed or none of the proxy's. Writes every number to --out (JSON) and prints the table of
benchmarks/reports/knobs_cpu-2core_2026-12-01.md;
`--from-json FILE` prints the table of an earlier run.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ilr_search.knobs import KNOB_CHOICES, KNOBS, config_key  # noqa: E402
from ilr_search.training.schedule import Map, format_reuse_map  # noqa: E402
from ilr_search.space import load_space  # noqa: E402

OFF = {name: KNOB_CHOICES[name][0] for name in KNOBS}
ONE_ON = {"injection=add": {"injection": "add"}, "injection=gated": {"injection": "gated"},
          "iteration_encoding": {"iteration_encoding": True}, "iteration_norms": {"iteration_norms": True},
          "depth_init": {"depth_init": True}}


def overrides(seed: int) -> dict:
    return {"train": {"seed": seed}, "search": {"knobs": list(KNOBS), "pruner": "none", "enqueue_paper_maps": False,
                                                 "noise_seeds": 0, "families": ["ilr"]}}


def configurations(reuse_map: list[int]) -> list[tuple[str, list[int], dict]]:
    ones = [1] * len(reuse_map)
    return ([("baseline", ones, OFF), ("off", reuse_map, OFF)]
            + [(label, reuse_map, OFF | on) for label, on in ONE_ON.items()])


def run_proxy_study(args: argparse.Namespace, seed: int) -> None:
    """One seed's study: the configurations enqueued, then run to completion (resumes if it exists)."""
    from ilr_search.search.run import RunRequest, prepare_study, run_in_process

    space = load_space(args.space, overrides(seed))
    reuse_map = list(Map.parse(args.map, space.model.n_layers).counts)
    configs = configurations(reuse_map)
    name = f"{args.prefix}-seed{seed}"
    request = RunRequest(space, args.budget, name, args.storage, n_trials=len(configs), race=False)  # audited at 4x below
    prepared = prepare_study(request)
    if not prepared.study.trials:
        for _, m, knobs in configs:
            prepared.study.enqueue_trial({f"r{i}": r for i, r in enumerate(m)} | knobs)
    run_in_process(request)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--space", default="bench-crossing")
    p.add_argument("--map", default="3,2,1,1", help="the best map of the space (bench-crossing's: 3,2,1,1)")
    p.add_argument("--budget", default="2x")
    p.add_argument("--factor", type=float, default=4.0)
    p.add_argument("--storage", default="sqlite:///benchmarks/out/knobs.db")
    p.add_argument("--prefix", default="knobs")
    p.add_argument("--out", default=f"benchmarks/data/knobs-cpu-{date.today().isoformat()}.json")
    p.add_argument("--from-json", help="print the table of an earlier run's JSON")
    p.add_argument("--proxy-seed", type=int, help=argparse.SUPPRESS)  # internal: run one seed's study
    args = p.parse_args()
    if args.proxy_seed is not None:
        run_proxy_study(args, args.proxy_seed)
        return
    if args.from_json:
        print_table(json.loads(Path(args.from_json).read_text()))
        return

    Path("benchmarks/out").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    me = [sys.executable, __file__, "--space", args.space, "--map", args.map, "--budget", args.budget,
          "--storage", args.storage, "--prefix", args.prefix]
    env_note = "OMP_NUM_THREADS=1 per process, two processes at a time"
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(me + ["--proxy-seed", str(s)], env=env, stdout=subprocess.DEVNULL) for s in (0, 1)]
    if any(proc.wait() for proc in procs):
        raise SystemExit("a proxy study failed")
    proxy_seconds = time.monotonic() - started
    audit = [sys.executable, "-m", "ilr_search", "audit", "--study", f"{args.prefix}-seed0", "--storage", args.storage,
             "--factor", f"{args.factor:g}", "--maps", "all", "--seeds", "2", "--json"]
    procs = [subprocess.Popen(audit, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [proc.communicate()[0] for proc in procs]
    if any(proc.returncode for proc in procs):
        raise SystemExit("an audit process failed")
    report = json.loads(outputs[-1])
    audit_seconds = time.monotonic() - started - proxy_seconds

    import optuna

    space = load_space(args.space)
    reuse_map = list(Map.parse(args.map, space.model.n_layers).counts)
    proxy: dict[str, list[float]] = {}
    for seed in (0, 1):
        study = optuna.load_study(study_name=f"{args.prefix}-seed{seed}", storage=args.storage)
        for t in study.trials:
            if "reused_from" not in t.user_attrs and t.user_attrs.get("val_ppl") is not None:
                proxy.setdefault(t.user_attrs["map_key"], []).append(t.user_attrs["val_ppl"])
    audited = {m["reuse_map"]: list(m["audit_ppls"]) for m in report["maps"]}

    key_off = config_key(format_reuse_map(reuse_map), {})
    rows = [{"config": label, "key": config_key(format_reuse_map(m), knobs),
             "proxy_ppls": proxy.get(config_key(format_reuse_map(m), knobs), []),
             "audit_ppls": audited.get(config_key(format_reuse_map(m), knobs), [])}
            for label, m, knobs in configurations(reuse_map)]
    result = {"date": date.today().isoformat(), "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores, "
              f"{platform.python_version()}", "space": args.space, "map": args.map, "budget": args.budget,
              "proxy_steps": report["proxy_steps"], "audit_steps": report["steps"], "factor": args.factor, "seeds": [0, 1],
              "proxy_seconds": round(proxy_seconds), "audit_seconds": round(audit_seconds), "threads": env_note,
              "audit_spearman": report.get("spearman"), "rows": rows, "key_off": key_off}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print_table(result)
    print(f"\n{round(proxy_seconds)} s of proxies, {round(audit_seconds)} s of audit; written to {args.out}")


def spread(values: list[float]) -> float:
    return max(values) - min(values)


def direction(delta: float, noise: float) -> str:
    return "no effect" if abs(delta) <= noise else ("worse" if delta > 0 else "better")


def audit_says(at_proxy: str, at_audit: str) -> str:
    if at_proxy == at_audit:
        return "confirms" if at_proxy != "no effect" else "agrees: no effect"
    if "no effect" not in (at_proxy, at_audit):
        return "reverses"
    return "finds an effect the proxy missed" if at_proxy == "no effect" else "does not confirm"


def print_table(result: dict) -> None:
    rows = {r["config"]: r for r in result["rows"]}
    off = rows["off"]
    s1, s4 = spread(off["proxy_ppls"]), spread(off["audit_ppls"])

    def ppls(values: list[float]) -> str:
        return ", ".join(f"{v:.3f}" for v in values) or "-"

    print(f"| configuration of {result['map']} | proxy ppl ({result['proxy_steps']} steps, seeds 0, 1) | Δ vs off "
          f"| audit ppl ({result['audit_steps']} steps, seeds 0, 1) | Δ vs off | the audit |")
    print("| --- | --- | ---: | --- | ---: | --- |")
    for r in result["rows"]:
        name = {"baseline": "all-ones baseline, knobs off", "off": "every knob off"}.get(r["config"], r["config"])
        cells = ["", "", ""]
        if r["config"] not in ("baseline", "off"):
            d1 = statistics.fmean(a - b for a, b in zip(r["proxy_ppls"], off["proxy_ppls"]))
            d4 = statistics.fmean(a - b for a, b in zip(r["audit_ppls"], off["audit_ppls"]))
            v1, v4 = direction(d1, s1), direction(d4, s4)
            cells = [f"{d1:+.3f} ({v1})", f"{d4:+.3f} ({v4})", audit_says(v1, v4)]
        print(f"| {name} | {ppls(r['proxy_ppls'])} | {cells[0]} | {ppls(r['audit_ppls'])} | {cells[1]} | {cells[2]} |")
    print(f"\nseed spread of the knobs-off map (the no-effect band): {s1:.3f} ppl at {result['proxy_steps']} steps, "
          f"{s4:.3f} at {result['audit_steps']}")


if __name__ == "__main__":
    main()
