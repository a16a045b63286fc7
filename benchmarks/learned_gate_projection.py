"""A variant of `run --learn`'s gate training (training/learned.learn_gates): learn_gates with the budget held by a projection (a common shift of every gate logit, found by bisection,
applied after each gate step while the expected FLOPs exceed the budget) instead of the Lagrange multiplier.
Does the multiplier's overshoot close the gates, or the loss? Prints the final gates, expected FLOPs and read-off map.

    python benchmarks/learned_gate_projection.py truth-nope 1.5x [3x ...]

2026-12-06, the 2-core Intel VM: truth-nope at 1.5x read off 1,1,1,1 here too (gates 0.05, 0.05, 0.05, 0.10 on pass
1; expected 1.06x, under the budget, so the projection had stopped acting): held exactly at the budget from the
start (every gate about 0.35), the loss closed them itself.
"""
import dataclasses, itertools, sys, time
import torch
import ilr_search.training.learned as L
from ilr_search.search.plan import plan_study
from ilr_search.space import load_space
from ilr_search.training.frozen import load_space_data
from ilr_search.training.build import build_model
from ilr_search.training.train import build_optimizer, set_lr

def project(cfg, logits, budget):
    with torch.no_grad():
        if float(L.expected_ratio(cfg, L.effective_gates(logits))) <= budget:
            return
        lo, hi = 0.0, 40.0
        for _ in range(50):
            mid = (lo + hi) / 2
            if float(L.expected_ratio(cfg, L.effective_gates(logits - mid))) > budget:
                lo = mid
            else:
                hi = mid
        logits -= hi

def learn(space_name, budget_text, steps=None):
    space = load_space(space_name)
    plan = plan_study(space, budget_text, None)
    cfg_t = dataclasses.replace(space.train, dtype=plan.dtype)
    data = load_space_data(space)
    mcfg = plan.trial_model({})
    model = build_model(mcfg, cfg_t.seed)
    logits = torch.full((mcfg.n_layers, space.search.max_reuse - 1), L.GATE_START, requires_grad=True)
    project(mcfg, logits, plan.budget.ratio)
    gopt = torch.optim.Adam([logits], lr=L.GATE_LR)
    opt = build_optimizer(model, cfg_t, torch.device("cpu"))
    for step in range(1, cfg_t.steps + 1):
        set_lr(opt, step, cfg_t)
        x, y = (torch.from_numpy(a) for a in data.train_batch(step - 1, cfg_t.batch_size, mcfg.seq_len, cfg_t.seed))
        loss = L.gated_loss(model, x, y, L.effective_gates(logits))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg_t.grad_clip)
        opt.step(); opt.zero_grad(set_to_none=True)
        gopt.step(); gopt.zero_grad(set_to_none=True)
        project(mcfg, logits, plan.budget.ratio)
    g = L.effective_gates(logits).detach()
    lg = L.LearnedGates(tuple(tuple(round(float(v), 4) for v in r) for r in g), float(L.expected_ratio(mcfg, g)), plan.budget.ratio, 0.0, cfg_t.steps, 0.0, False)
    print(space_name, budget_text, "gates", lg.gates, "expected", round(lg.expected_ratio, 3), "map", lg.counts(plan.budget.max_layer_runs(plan.model)))

for b in sys.argv[2:]:
    learn(sys.argv[1], b)
