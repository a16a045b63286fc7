"""The positive control of a frozen search: a model trained with a known map, exported as a plain checkpoint of its
distinct layers, imported and searched frozen. Does the search find the map it was trained with, and does the race
claim it over the all-ones map?

For each training seed: `train` the in-package model with map 2,2,1,1 (4 layers, d_model 64, 4 heads, seq 64,
batch 16, lr 3e-3, 800 steps, the embedded corpus, byte tokens) and save it; `export-model --model DIR --map
1,1,1,1` (its 4 distinct layers as a plain 4-layer Llama checkpoint); `run --init OUT --train-steps 0 --budget
1.5x --json`, and its decided best exported (`export-model --study`). The same with a block-trained model (`--block 2`, the whole stack twice) searched at --budget 2x with
the `blocks` family. Each stage is timed (wall seconds, as a user runs the commands), and the frozen evaluation's
tokens/s is measured on the exported checkpoint with the search's own evaluation (training/frozen.py). Last, the
frozen evaluation throughput of a 4-layer d_model 128 imported model on one core.

    nice python benchmarks/positive_control.py [--seeds 0,1,2] [--steps 800] [--skip-block] [--work DIR]
        [--prepare-only] [--out benchmarks/data/positive-control-DATE.json]

With --work DIR kept, a second invocation reuses the models and checkpoints it trained and exported (each stage's
result and time is kept beside them); --prepare-only stops after them.
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TRAINED_MAP = "2,2,1,1"
PLAIN_MAP = "1,1,1,1"
MODEL = {"layers": 4, "d_model": 64, "heads": 4, "seq_len": 64}
TRAIN = {"batch_size": 16, "lr": 3e-3, "device": "cpu", "dtype": "fp32"}
CASES = {  # name: (train flags, search budget, search families)
    "map-2,2,1,1": (["--reuse-map", TRAINED_MAP], "1.5x", ["ilr", "block"]),
    "block2": (["--block", "2"], "2x", ["ilr", "blocks"]),
}
EXPECTED = {"map-2,2,1,1": TRAINED_MAP, "block2": "block:0-3:2"}


def write_space(path: Path, steps: int, families: list[str]) -> Path:
    """default.toml with the control's model, training and search families (one map at a time: --init needs it)."""
    import tomli_w

    from ilr_search.space import DEFAULT_SPACE

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    raw = tomllib.loads(DEFAULT_SPACE.read_text(encoding="utf-8"))
    raw["model"].update(MODEL)
    raw["train"].update(TRAIN | {"steps": steps})
    raw["search"].update({"families": families, "fuse": 1})
    path.write_text(tomli_w.dumps(raw), encoding="utf-8")
    return path


def cli(*args: str) -> tuple[dict[str, Any], float, list[str]]:
    """`python -m ilr_search ARGS --json` in a subprocess: its JSON, wall seconds, and the command as a user types it."""
    command = [sys.executable, "-m", "ilr_search", *args, "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    t0 = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"ilr-search {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout), seconds, ["ilr-search", *args, "--json"]


def frozen_tokens_per_second(checkpoint: Path, schedule: list[int], seq_len: int, windows: int = 128,
                             repeats: int = 3) -> dict[str, Any]:
    """The search's frozen evaluation (FrozenEvaluator, fp32, the space's batch size, no shared prefix) of an imported
    checkpoint on `windows` held-out windows of the embedded corpus, one thread; the best of `repeats` timings."""
    import torch

    from ilr_search.commands.api import with_init
    from ilr_search.data.tokens import load_space_tokens
    from ilr_search.space import load_space
    from ilr_search.training.frozen import FrozenEvaluator
    from ilr_search.training.train import build_model

    torch.set_num_threads(1)
    space = with_init(load_space(None, {"model": {"seq_len": seq_len}}), str(checkpoint))
    data = load_space_tokens(space)
    model = build_model(space.model, seed=0)
    evaluator = FrozenEvaluator(model, data, "fp32", space.train.batch_size, cache_bytes=0)
    evaluator.evaluate(space.model, schedule, 0, 8, share=False)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        evaluator.evaluate(space.model, schedule, 1, windows, share=False)
        best = min(best, time.perf_counter() - t0)
    tokens = windows * seq_len
    return {"checkpoint": str(checkpoint), "schedule": schedule, "seq_len": seq_len, "windows": windows,
            "threads": torch.get_num_threads(), "seconds": best, "tokens_per_second": tokens / best}


def d128_throughput(work: Path) -> list[dict[str, Any]]:
    """A 4-layer d_model 128 model written as a Llama checkpoint (random weights), imported and evaluated frozen."""
    import dataclasses

    import torch

    from ilr_search.config import ModelConfig
    from ilr_search.training.model import ILRTransformer
    from ilr_search.training.pretrained import export_checkpoint

    out = []
    for seq_len in (64, 256):
        torch.manual_seed(0)
        cfg = dataclasses.replace(ModelConfig(), vocab_size=256, n_layers=4, d_model=128, n_heads=4, seq_len=seq_len,
                                  pe="rope")
        folder = export_checkpoint(ILRTransformer(cfg), [0, 1, 2, 3], work / f"d128-seq{seq_len}")
        out.append(frozen_tokens_per_second(folder, [0, 1, 2, 3], seq_len) | {"d_model": 128, "layers": 4})
    return out


def stage(folder: Path, name: str, *args: str) -> tuple[dict[str, Any], float, list[str]]:
    """cli(*args), its result kept in folder/stage-NAME.json: a second invocation with the same --work reuses it
    (the training and export can run before the search's code is there)."""
    kept = folder / f"stage-{name}.json"
    if kept.is_file():
        record = json.loads(kept.read_text(encoding="utf-8"))
        return record["result"], record["seconds"], record["command"]
    result, seconds, command = cli(*args)
    kept.write_text(json.dumps({"result": result, "seconds": seconds, "command": command}), encoding="utf-8")
    return result, seconds, command


def prepare(name: str, seed: int, steps: int, work: Path) -> tuple[Path, dict[str, Any]]:
    """Train the model of case `name` at `seed` and export its distinct layers as a plain checkpoint."""
    train_flags, _, families = CASES[name]
    folder = work / f"{name}-seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    space = write_space(folder / "space.toml", steps, families)
    model, plain = folder / "model", folder / "plain"
    trained, train_s, train_cmd = stage(folder, "train", "train", "--space", str(space), *train_flags, "--seed",
                                        str(seed), "--save", str(model))
    exported, export_s, export_cmd = stage(folder, "export", "export-model", "--model", str(model), "--map",
                                           PLAIN_MAP, "--out", str(plain))
    return folder, {"train": {"val_loss": trained["val_loss"], "seconds": train_s,
                              "train_seconds": trained["train_seconds"],
                              "tokens_per_second": trained["tokens_per_second"], "command": " ".join(train_cmd)},
                    "export": {"seconds": export_s, "family": exported["family"], "command": " ".join(export_cmd)}}


def control(name: str, seed: int, steps: int, work: Path) -> dict[str, Any]:
    _, budget, families = CASES[name]
    folder, prepared = prepare(name, seed, steps, work)
    space, plain, db = folder / "space.toml", folder / "plain", f"sqlite:///{folder / 'studies.db'}"
    summary, search_s, search_cmd = cli("run", "--space", str(space), "--init", str(plain), "--train-steps", "0",
                                        "--budget", budget, "--storage", db)
    race = summary.get("race") or {}
    comparisons = {c["map"]: c for c in race.get("comparisons", [])}
    expected = EXPECTED[name]
    tried = sorted({r["map_key"] for r in race.get("results", []) if str(r.get("source", "")).startswith("trial")})
    chunk0 = {r["map_key"]: r["val_loss"] for r in race.get("results", []) if r.get("seed") == 0}
    claim = comparisons.get(expected, {})
    # the study's decided best, as export-model --study (and recipe) take it, written as a standard checkpoint
    best, best_s, best_cmd = stage(folder, "best", "export-model", "--study", summary["study"], "--storage", db,
                                   "--out", str(folder / "best"))
    best_map = best["map"]
    race_chunks = sorted({r["seed"] for r in race.get("results", []) if r.get("seed", 0) > 0})
    chunk_means = {}  # each map's mean loss over the race's chunks (after the screen's), where it has them all
    for key in {r["map_key"] for r in race.get("results", [])}:
        losses = {r["seed"]: r["val_loss"] for r in race["results"] if r["map_key"] == key and r["seed"] > 0}
        if race_chunks and all(c in losses for c in race_chunks):
            chunk_means[key] = sum(losses[c] for c in race_chunks) / len(race_chunks)
    schedule = [i for i, r in enumerate(map(int, TRAINED_MAP.split(","))) for _ in range(r)] \
        if name.startswith("map") else [0, 1, 2, 3, 0, 1, 2, 3]
    return {
        "case": name, "seed": seed, "expected_map": expected, "budget": budget, "families": families,
        **prepared,
        "search": {"seconds": search_s, "study": summary.get("study"), "command": " ".join(search_cmd),
                   "trial_maps": tried, "expected_map_tried": expected in tried,
                   "best_on_chunk0": min(chunk0, key=chunk0.get) if chunk0 else None,
                   "decided_best": best_map, "found": best_map == expected,
                   "export_best": {"seconds": best_s, "command": " ".join(best_cmd)},
                   "race_chunks": race_chunks, "race_chunk_mean_loss": chunk_means,
                   "answer": summary.get("answer"), "verdict": summary.get("verdict"),
                   "detectable_gap_nats": summary.get("detectable_gap"),
                   "claimed_over_all_ones": claim.get("status") == "better",
                   "expected_map_comparison": claim or None,
                   "comparisons": [{k: c.get(k) for k in ("map", "status", "seeds", "mean_diff", "interval")}
                                   for c in comparisons.values()]},
        "frozen_eval": frozen_tokens_per_second(plain, schedule, MODEL["seq_len"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--skip-block", action="store_true")
    parser.add_argument("--prepare-only", action="store_true", help="train and export only (kept in --work)")
    parser.add_argument("--throughput-only", action="store_true",
                        help="only the frozen evaluation speed of the 4-layer d_model 128 checkpoint, written to "
                             "benchmarks/data/frozen-eval-throughput-DATE.json")
    parser.add_argument("--work", type=Path, default=None, help="where models, checkpoints and studies go "
                        "(default: a temporary folder)")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "benchmarks" / "data" / f"positive-control-{date.today()}.json")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="positive-control-"))
    os.environ.setdefault("ILR_SEARCH_CACHE", str(work / "cache"))
    report: dict[str, Any] = {"date": str(date.today()), "machine": platform.platform(),
                              "load_average_at_start": os.getloadavg(),
                              "cpus": os.cpu_count(), "python": platform.python_version(),
                              "steps": args.steps, "model": MODEL, "train": TRAIN, "runs": []}

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")

    cases = [n for n in CASES if not (args.skip_block and n == "block2")]
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.prepare_only:
        for name in cases:
            for seed in seeds:
                print(name, seed, prepare(name, seed, args.steps, work)[1], flush=True)
        return
    if args.throughput_only:
        out = ROOT / "benchmarks" / "data" / f"frozen-eval-throughput-{date.today()}.json"
        measured = {key: report[key] for key in ("date", "machine", "load_average_at_start", "cpus", "python")}
        measured |= {"d128_frozen_eval": d128_throughput(work), "load_average_at_end": os.getloadavg()}
        out.write_text(json.dumps(measured, indent=1) + "\n", encoding="utf-8")
        print(json.dumps(measured["d128_frozen_eval"], indent=1))
        print(f"wrote {out}")
        return
    report["d128_frozen_eval"] = d128_throughput(work)
    save()
    for name in cases:
        for seed in seeds:
            run = control(name, seed, args.steps, work) | {"load_average": os.getloadavg()}
            report["runs"].append(run)
            save()
            s = run["search"]
            gap = (s["detectable_gap_nats"] or {}).get("nats")
            print(f"{name} seed {seed}: tried {s['expected_map_tried']}, decided best {s['decided_best']}, claimed "
                  f"{s['claimed_over_all_ones']}, detectable gap {gap} nats, times train {run['train']['seconds']:.0f}s "
                  f"export {run['export']['seconds']:.0f}s search {s['seconds']:.0f}s", flush=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
