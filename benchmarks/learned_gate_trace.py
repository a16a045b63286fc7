"""Why do the gates close? The gate training of `run --learn` (training/learned.learn_gates, unchanged), traced: the
effective gates at every step and the Lagrange multiplier reconstructed from them (the same dual ascent:
m <- max(0, m + DUAL_STEP * (expected - budget)), which learn_gates applies after each step's gradient).

    python benchmarks/learned_gate_trace.py --space truth-nope --budget 1.5x --budget 3x [--layers 4] [--out FILE]

At a budget the widest schedule fits (3x on a 4-layer max_reuse-3 space: 2.82x), the multiplier never acts: what the
gates do there is the loss's doing alone. Writes benchmarks/data/learned-gate-trace-SPACE-2026-12-06.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def trace(space_name: str, budget: str, layers: int | None) -> dict:
    import torch

    import ilr_search.training.learned as learned_mod
    from ilr_search.search.plan import plan_study
    from ilr_search.space import load_space
    from ilr_search.training.frozen import load_space_data

    space = load_space(space_name, {"model": {"layers": layers}} if layers else None)
    plan = plan_study(space, budget, None)
    train = dataclasses.replace(space.train, dtype=plan.dtype)
    seen: list[list[list[float]]] = []
    original = learned_mod.effective_gates

    def recording(logits: torch.Tensor) -> torch.Tensor:
        gates = original(logits)
        seen.append(gates.detach().cpu().tolist())
        return gates

    learned_mod.effective_gates = recording
    try:
        result = learned_mod.learn_gates(
            plan.trial_model({}), load_space_data(space), train, plan.budget.ratio, space.search.max_reuse
        )
    finally:
        learned_mod.effective_gates = original
    per_step = seen[:-1][:: max(1, train.grad_accum)]  # the last call is the read-off
    cfg = plan.trial_model({})
    multiplier, rows = 0.0, []
    for step, gates in enumerate(per_step, start=1):
        expected = float(learned_mod.expected_ratio(cfg, torch.tensor(gates)))
        rows.append({"step": step, "gates": gates, "expected_ratio": expected, "multiplier_before": multiplier})
        multiplier = max(0.0, multiplier + learned_mod.DUAL_STEP * (expected - plan.budget.ratio))
    return {
        "space": space_name,
        "layers": cfg.n_layers,
        "budget": budget,
        "budget_ratio": plan.budget.ratio,
        "final_gates": [list(r) for r in result.gates],
        "final_expected_ratio": result.expected_ratio,
        "final_multiplier": result.multiplier,
        "reconstructed_final_multiplier": multiplier,
        "map": learned_mod.LearnedGates.counts(result, plan.budget.max_layer_runs(plan.model)),
        "peak_multiplier": max(r["multiplier_before"] for r in rows),
        "first_step_under_budget": next((r["step"] for r in rows if r["expected_ratio"] <= plan.budget.ratio), None),
        "steps": rows,
        "seconds": result.seconds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="truth-nope")
    ap.add_argument("--budget", action="append", default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    runs = [trace(args.space, b, args.layers) for b in (args.budget or ["1.5x", "3x"])]
    for r in runs:
        s = r["steps"]
        print(
            f"{r['space']} at {r['budget']}: map {r['map']}, final expected {r['final_expected_ratio']:.3f}x, "
            f"multiplier peak {r['peak_multiplier']:.3g}, under budget from step {r['first_step_under_budget']}; "
            f"layer 0 pass 1 gate at steps 1, 25, 50, 100, end: "
            + ", ".join(f"{s[i - 1]['gates'][0][0]:.3f}" for i in (1, 25, 50, 100) if i <= len(s))
            + f", {r['final_gates'][0][0]:.3f}"
        )
    suffix = f"-L{args.layers}" if args.layers else ""
    out = Path(args.out or ROOT / f"benchmarks/data/learned-gate-trace-{args.space}{suffix}-2026-12-06.json")
    out.write_text(json.dumps({"runs": runs}, indent=None) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
