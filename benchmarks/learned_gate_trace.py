"""Why do the gates close? The gate training of `run --learn` (training/learned.learn_gates, unchanged), traced: the
effective gates at every step (as each step's loss saw them) and the budget's target then (learned.py: from the widest
schedule's expected FLOPs down to the budget over the first ANNEAL_SHARE of the steps).

    python benchmarks/learned_gate_trace.py --space truth-nope --budget 1.5x --budget 3x [--layers 4] [--out FILE]

At a budget the widest schedule fits (3x on a 4-layer max_reuse-3 space: 2.82x), the budget never acts: what the
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
    widest = float(learned_mod.expected_ratio(cfg, learned_mod.effective_gates(torch.full_like(torch.tensor(seen[0]), learned_mod.GATE_START))))
    share = max(1.0, learned_mod.ANNEAL_SHARE * len(per_step))
    rows = []
    for step, gates in enumerate(per_step, start=1):
        expected = float(learned_mod.expected_ratio(cfg, torch.tensor(gates)))
        target = widest + (plan.budget.ratio - widest) * min(1.0, (step - 1) / share)
        rows.append({"step": step, "gates": gates, "expected_ratio": expected, "target_before": target})
    return {
        "space": space_name,
        "layers": cfg.n_layers,
        "budget": budget,
        "budget_ratio": plan.budget.ratio,
        "final_gates": [list(r) for r in result.gates],
        "final_expected_ratio": result.expected_ratio,
        "shift": result.shift,
        "map": learned_mod.LearnedGates.counts(result, plan.budget.max_layer_runs(plan.model)),
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
    ap.add_argument("--date", default="2026-12-06")
    ap.add_argument("--tag", default="", help="added to the JSON's name (e.g. -annealed)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    runs = [trace(args.space, b, args.layers) for b in (args.budget or ["1.5x", "3x"])]
    for r in runs:
        s = r["steps"]
        print(
            f"{r['space']} at {r['budget']}: map {r['map']}, final expected {r['final_expected_ratio']:.3f}x, "
            f"logit shift {r['shift']:.3g}, under budget from step {r['first_step_under_budget']}; "
            f"layer 0 pass 1 gate at steps 1, 25, 50, 100, end: "
            + ", ".join(f"{s[i - 1]['gates'][0][0]:.3f}" for i in (1, 25, 50, 100) if i <= len(s))
            + f", {r['final_gates'][0][0]:.3f}"
        )
    suffix = f"-L{args.layers}" if args.layers else ""
    out = Path(args.out or ROOT / f"benchmarks/data/learned-gate-trace-{args.space}{suffix}{args.tag}-{args.date}.json")
    out.write_text(json.dumps({"runs": runs}, indent=None) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
