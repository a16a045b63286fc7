"""Does a change keep the frozen evaluator's numbers? Scores a pretrained model (a GGUF file or a transformers
folder) running a few maps on window chunks 0 and 1 of the blocks-scan space (bf16 where the CPU has it, shared
prefixes), every window's loss into one JSON; `--compare` says, map by map, whether two such files are equal.

    python benchmarks/frozen_identity.py --init SmolLM2-135M-Instruct.Q4_1.gguf --out A.json   # at one commit
    python benchmarks/frozen_identity.py --init SmolLM2-135M-Instruct.Q4_1.gguf --out B.json   # at another
    python benchmarks/frozen_identity.py --compare A.json B.json

The maps fit a 30-layer model (SmolLM2's): the plain model and four blocks, short and long.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

MAPS = ("block:0-29:1", "block:8-8:2", "block:15-15:2", "block:1-8:2", "block:3-20:2")


def scores(init: str) -> dict[str, list[list[float]]]:
    from ilr_search.commands.api import with_init
    from ilr_search.space import load_space
    from ilr_search.training.frozen import chunk_scores, load_space_data
    from ilr_search.training.schedule import Map

    space = with_init(load_space("blocks-scan", {}), init)
    space = replace(space, train=replace(space.train, steps=0))
    data = load_space_data(space)
    out = {}
    for text in MAPS:
        schedule = Map.parse(text, space.model.n_layers).schedule()
        out[text] = [list(map(float, c.scores)) for c in chunk_scores(space.model, schedule, data, space.train, [0, 1])]
    return out


def compare(a: Path, b: Path) -> int:
    first, second = (json.loads(p.read_text()) for p in (a, b))
    differ = 0
    for text in first:
        pairs = [(x, y) for ca, cb in zip(first[text], second[text], strict=True) for x, y in zip(ca, cb, strict=True)]
        largest = max(abs(x - y) for x, y in pairs)
        equal = " (equal)" if largest == 0 else ""
        print(f"{text}: {len(pairs)} window losses, largest difference {largest:.3g}{equal}")
        differ += largest != 0
    return int(differ > 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--init", help="the pretrained model: a GGUF file or a transformers folder")
    ap.add_argument("--out", help="where the scores go (JSON)")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = ap.parse_args()
    if args.compare:
        raise SystemExit(compare(*(Path(p) for p in args.compare)))
    if not (args.init and args.out):
        ap.error("--init and --out, or --compare A B")
    Path(args.out).write_text(json.dumps(scores(args.init)) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
