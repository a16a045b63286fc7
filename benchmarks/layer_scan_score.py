"""layer-scan's own scorer on a custom probe file, per item: run by benchmarks/peers.py with the python of
layer-scan's venv (it imports layer_scan, never ilr_search).

    python benchmarks/layer_scan_score.py --model DIR --probe FILE.probe.json --block I J [--dtype float32] --out F.json

Loads DIR with layer-scan's TransformersBackend (as `layer-scan scan` does), reads FILE with its CustomProbe
(`scoring: digits`), and scores every sample through layer-scan's scanner (`_evaluate_config`, then
`score_from_logits` and `aggregate_scores_full`) three ways:

- `base`: the plain model, through the batched forward that `layer-scan scan` uses for its baseline;
- `block`: layer-scan's duplication (i, j) (layers i..j-1 run twice, j excluded, as its results.json names it),
  through its layer loop, as its scan scores each block;
- `base_layer_loop`: the plain model through that same layer loop (the duplication (0, 0)), which checks that the
  two paths layer-scan compares agree.

Per item: the expected digit (layer-scan's score: the mean of 0..9 under the softmax over the ten digit tokens at
the position after the prompt), the argmax digit, whether it is the correct answer, the log-odds of the correct
digit and the digits' share of the full vocabulary's probability (coverage). Written as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--probe", required=True, type=Path)
    ap.add_argument("--block", nargs=2, type=int, required=True, metavar=("I", "J"))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()

    import importlib.metadata

    import layer_scan
    import torch
    import transformers
    from layer_scan.backends.transformers_backend import TransformersBackend
    from layer_scan.config import DuplicationConfig
    from layer_scan.probes.custom import CustomProbe
    from layer_scan.scanner import _evaluate_config
    from layer_scan.scoring import aggregate_scores_full

    started = time.perf_counter()
    backend = TransformersBackend()
    backend.load(args.model, dtype=args.dtype)
    tokenizer = backend.get_tokenizer()
    probe = CustomProbe(args.probe)
    probe.validate(tokenizer)
    samples = probe.get_samples()
    token_ids, values = probe.get_score_token_ids(tokenizer)
    n_layers = backend.get_total_layers()
    load_seconds = time.perf_counter() - started
    i, j = args.block
    configs = {
        "base": None,
        "block": DuplicationConfig(i=i, j=j, total_layers=n_layers),
        "base_layer_loop": DuplicationConfig(i=0, j=0, total_layers=n_layers),
    }
    scored = {}
    for name, config in configs.items():
        t0 = time.perf_counter()
        results = _evaluate_config(backend, config, samples, token_ids, values, tokenizer=tokenizer)
        seconds = time.perf_counter() - t0
        agg = aggregate_scores_full(results)
        scored[name] = {
            "config": None if config is None else {"i": config.i, "j": config.j},
            "seconds": seconds,
            "mean_score": agg.mean_score,
            "mean_uncertainty": agg.mean_uncertainty,
            "accuracy": agg.accuracy,
            "mean_log_odds": agg.mean_log_odds,
            "mean_coverage": agg.mean_coverage,
            "items": [
                {
                    "expected": r.expected_score,
                    "argmax": int(values[max(range(len(r.probabilities)), key=r.probabilities.__getitem__)]),
                    "correct": r.is_correct,
                    "log_odds": r.log_odds,
                    "coverage": r.coverage,
                }
                for r in results
            ],
        }
    first = tokenizer(samples[0].full_text)["input_ids"]
    out = {
        "layer_scan": importlib.metadata.version("layer-scan"),
        "layer_scan_module_version": layer_scan.__version__,  # 0.2.2's module says 0.2.1
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "model": args.model,
        "probe": str(args.probe),
        "dtype": args.dtype,
        "n_layers": n_layers,
        "n_items": len(samples),
        "correct_answers": [s.correct_answer for s in samples],
        "digit_token_ids": token_ids,
        "first_prompt_token_ids": list(first),
        "load_seconds": load_seconds,
        "scored": scored,
    }
    args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
