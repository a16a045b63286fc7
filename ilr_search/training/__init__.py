"""Training: the ILR transformer and how one proxy (or K fused proxies) is trained.

- schedule.py: reuse maps and block recurrence as execution schedules; flops.py: FLOPs and budgets;
- model.py: the decoder that follows a schedule; loss.py: its fused, chunked LM-head cross-entropy;
- device.py: device, dtype and compile choices; checkpoint.py: a proxy's state saved atomically;
- train.py: one proxy trained and evaluated; fused.py: K proxies trained in lockstep in one process.
"""
