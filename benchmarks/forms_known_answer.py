"""The sub-module known answer, run N times: is the map a checkpoint was trained with claimed, and does an A/A judge
of one-branch candidates stay silent?

For each seed: the in-package model (4 layers, d_model 64, 4 heads, seq 64, byte tokens, the embedded corpus) is
trained with `1,3a,1,1` (layer 1's attention three times, then its MLP once) and its four distinct layers are written
as a plain 4-layer Llama checkpoint. Then
- a frozen search of it with parts (`run --init CK --train-steps 0 --parts both,attn,mlp`, the training map, the
  whole-layer map of the same counts `1,3,1,1` and an MLP map enqueued, 4 more trials by TPE) races its contenders on
  held-out window chunks: the run counts as a claim where the answer is `use 1,3a,1,1`;
- `judge` of `1,2a,1,1|damping=1e-7` and `1,1,2m,1|damping=1e-7` (the model itself but for float rounding: a
  one-branch pass damped to nothing) against the checkpoint: a false yes is either claimed better or worse.

    python benchmarks/forms_known_answer.py --seeds 6 --out benchmarks/data/forms-known-answer-DATE.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAINED = "1,3a,1,1"
WHOLE = "1,3,1,1"
SPACE = """[model]
seq_len = 64
[data]
corpus = "stdlib"
tokenizer = "byte"
[train]
steps = 1
batch_size = 8
eval_windows = 16
seed = 0
[search]
families = ["ilr"]
max_reuse = 3
n_trials = 8
noise_seeds = 0
enqueue_paper_maps = false
parts = ["both", "attn", "mlp"]
race_seeds = 3
max_seeds = 8
race_contenders = 3
"""


def checkpoint(seed: int, steps: int, folder: Path) -> Path:
    """The model trained with TRAINED at `seed`, its layers written as a plain 4-layer Llama in `folder`."""
    from ilr_search.config import DataConfig, ModelConfig, TrainConfig
    from ilr_search.data.tokens import load_tokens
    from ilr_search.training.pretrained import export_checkpoint
    from ilr_search.training.schedule import Map
    from ilr_search.training.train import train_proxy

    chosen = Map.parse(TRAINED, 4)
    cfg = chosen.configure(ModelConfig(vocab_size=256, n_layers=4, d_model=64, n_heads=4, seq_len=64))
    train = TrainConfig(
        steps=steps, batch_size=16, lr=3e-3, eval_fractions=(1.0,), eval_windows=32, seed=seed, device="cpu"
    )
    trained: list = []
    result = train_proxy(
        cfg, chosen.schedule(), load_tokens(DataConfig(), seq_len=64), train, on_trained=trained.append
    )
    assert result.status == "ok", result.reason
    return export_checkpoint(trained[0], [0, 1, 2, 3], folder / f"ck-{seed}")


def cli(*args: str, cwd: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "ilr_search", *args, "--json"], cwd=cwd, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"ilr-search {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def one_seed(seed: int, steps: int, work: Path) -> dict:
    t0 = time.perf_counter()
    ck = checkpoint(seed, steps, work)
    trained_s = time.perf_counter() - t0
    space = work / "space.toml"
    space.write_text(SPACE, encoding="utf-8")
    db = f"sqlite:///{work / f'seed{seed}.db'}"
    common = ["--space", str(space), "--init", str(ck), "--storage", db]
    run = cli(
        "run", *common, "--train-steps", "0", "--budget", "1.5x", "--enqueue", f"{TRAINED} {WHOLE} 1,1,3m,1", cwd=work
    )
    judge = cli(
        "judge",
        *common,
        "--chunks",
        "8",
        "--candidate",
        "1,2a,1,1|damping=1e-7",
        "--candidate",
        "1,1,2m,1|damping=1e-7",
        cwd=work,
    )
    comparisons = {
        c["map"]: {k: c.get(k) for k in ("status", "mean_diff", "interval", "detectable")}
        for c in run["race"]["comparisons"]
    }
    aa = {c["map"]: {k: c.get(k) for k in ("status", "mean_diff", "units")} for c in judge["race"]["comparisons"]}
    return {
        "seed": seed,
        "answer": run["answer"],
        "claimed": run["answer"].startswith(f"use {TRAINED}:"),
        "comparisons": comparisons,
        "aa_answer": judge["answer"],
        "aa": aa,
        "aa_false_yes": sum(c["status"] in ("better", "worse") for c in aa.values()),
        "seconds": {"train": round(trained_s, 1), "all": round(time.perf_counter() - t0, 1)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=600, help="training steps of each checkpoint")
    ap.add_argument("--out", default=f"benchmarks/data/forms-known-answer-{date.today()}.json")
    args = ap.parse_args()
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            runs.append(one_seed(seed, args.steps, Path(tmp)))
            r = runs[-1]
            print(
                f"seed {seed}: claimed {r['claimed']} ({r['answer'][:90]}); A/A false yes {r['aa_false_yes']}",
                flush=True,
            )
            write_summary(runs, Path(args.out))  # after every seed: a stopped run keeps what it measured
    print(f"claimed {sum(r['claimed'] for r in runs)} of {len(runs)}")


def write_summary(runs: list[dict], out: Path) -> None:
    summary = {
        "date": str(date.today()),
        "machine": platform.processor() or platform.machine(),
        "command": " ".join(sys.argv),
        "claimed": sum(r["claimed"] for r in runs),
        "runs": len(runs),
        "aa_false_yes": sum(r["aa_false_yes"] for r in runs),
        "aa_comparisons": sum(len(r["aa"]) for r in runs),
        "seeds": runs,
    }
    out.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
