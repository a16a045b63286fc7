"""Where a proxy run's wall time goes at the default CPU settings: data loading, evaluation, training.

    python benchmarks/train_split.py [--reuse-map 2,2,1,1,1,1,1,1] [--space search_spaces/default.toml]

Data loading = opening the token cache (the corpus is tokenized once beforehand, as in a search) plus drawing
every training batch; evaluation = every validation pass. The goal is data + evaluation <= 5% of the wall time.
"""

from __future__ import annotations

import argparse
import time

from ilr_search.data.tokenizers import model_config
from ilr_search.data.tokens import load_space_tokens
from ilr_search.training.schedule import resolve_schedule
from ilr_search.space import load_space
from ilr_search.training.train import train_proxy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default=None)
    ap.add_argument("--reuse-map", default=None)
    args = ap.parse_args()
    space = load_space(args.space)
    load_space_tokens(space)  # warm the cache, as the first trial of a study does
    wall = time.perf_counter()
    t = time.perf_counter()
    data = load_space_tokens(space)
    open_seconds = time.perf_counter() - t
    cfg = model_config(space, data.vocab_size)
    _, schedule, _ = resolve_schedule(cfg.n_layers, args.reuse_map)
    result = train_proxy(cfg, schedule, data, space.train)
    wall = time.perf_counter() - wall
    data_seconds = open_seconds + result.data_seconds
    train_seconds = wall - data_seconds - result.eval_seconds
    print(f"map {schedule}, {result.steps} steps, dtype {result.dtype}, wall {wall:.2f} s")
    print("| part | seconds | share |")
    print("| --- | ---: | ---: |")
    for name, seconds in (("data loading", data_seconds), ("evaluation", result.eval_seconds),
                          ("training steps", train_seconds)):
        print(f"| {name} | {seconds:.3f} | {seconds / wall:.1%} |")
    print(f"| data + evaluation | {data_seconds + result.eval_seconds:.3f} | "
          f"{(data_seconds + result.eval_seconds) / wall:.1%} |")


if __name__ == "__main__":
    main()
