#!/usr/bin/env bash
# CUDA smoke test and GPU figures, one short script for a GPU machine (benchmarks/reports/gpu_h200_2026-11-30.md reports its last run).
#   bash benchmarks/gpu_check.sh            # writes benchmarks/out/gpu/ (or $OUT)
# 1. the fused loss and the sync counts on CUDA (tests/test_loss.py: bf16, compiled head, sync detector);
# 2. one paper-small proxy through `ilr-search train` (bf16 + layer compile, BPE 1024 on the embedded corpus);
# 3. a tiny study through `ilr-search run --workers 2` on CUDA with pruning, then `pareto` and `trials`;
# 4. throughput at the paper's two sizes, the old trainer step (plain) against the new one (fused);
# 5. the compiled fused trainer (issue 20): tests/test_fused_compile.py with inductor on CUDA (compile counts,
#    compiled = uncompiled), then benchmarks/fused.py at paper-small, bf16 + compile, K = 1, 2, 4, 8 fused against
#    one after another (expected about 2-4 min, mostly inductor compiling each members-running count once: not
#    yet run on a GPU; the tests are cut at 150 s and the benchmark at 240 s, the rows measured by then kept).
set -euo pipefail
OUT=${OUT:-benchmarks/out/gpu}
ROOT=$(pwd)
mkdir -p "$OUT"
ILR="python3 -m ilr_search"
export ILR_SEARCH_CACHE=${ILR_SEARCH_CACHE:-/tmp/ilr-cache}
work=$(mktemp -d)
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader;
  python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"; } | tee "$OUT/device.txt"

t0=$SECONDS
python3 -m pytest -q -p no:cacheprovider tests/test_loss.py 2>&1 | tail -3 | tee "$OUT/tests.txt"
echo "tests: $((SECONDS - t0)) s"

t0=$SECONDS
$ILR train --space paper-small-offline --steps 100 --reuse-map 2,1,1,1 --json > "$OUT/train.json"
python3 -c "import json; r=json.load(open('$OUT/train.json')); print('train', r['status'], r['device'], r['dtype'], 'ppl', round(r['val_ppl'],2), 'tok/s', round(r['tokens_per_second']))"
echo "train: $((SECONDS - t0)) s"

t0=$SECONDS
(cd "$work" && $ILR run --space "$ROOT/tests/spaces/tiny.toml" --device cuda --dtype bf16 --compile \
   --budget 2x --n-trials 8 --workers 2 --storage sqlite:///smoke.db --study smoke --json > "$OUT/smoke_run.json" \
 && $ILR pareto --storage sqlite:///smoke.db --json > "$OUT/smoke_pareto.json" \
 && $ILR trials --storage sqlite:///smoke.db --json > "$OUT/smoke_trials.json")
python3 -c "import json; r=json.load(open('$OUT/smoke_run.json')); print('run', r['n_trials'], 'trials', r['n_pruned'], 'pruned', 'workers', [w['exit_code'] for w in r['workers']])"
echo "run: $((SECONDS - t0)) s"

t0=$SECONDS
python3 benchmarks/throughput.py --device cuda --d-model 128 --layers 4 --heads 4 --seq-len 1024 --batch-size 64 \
  --vocab 1024 --modes bf16,bf16+compile --steps 20 --repeats 3 --json > "$OUT/throughput_small.json"
python3 benchmarks/throughput.py --device cuda --d-model 768 --layers 8 --heads 8 --seq-len 1024 --batch-size 8 \
  --vocab 32000 --modes bf16+compile --steps 10 --repeats 3 --json > "$OUT/throughput_large.json"
python3 -c "
import json
for size in ('small', 'large'):
    for r in json.load(open('$OUT/throughput_' + size + '.json'))['rows']:
        print(size, r['mode'], r['head'], f\"{r['tokens_per_second']:,.0f} tok/s\", f\"MFU {r['mfu']:.0%}\", f\"{r['max_memory_gib'] or 0:.1f} GiB\")"
echo "throughput: $((SECONDS - t0)) s"

t0=$SECONDS
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_fused_compile.py -k cuda 2>&1 | tail -3 \
  | tee "$OUT/tests_fused_compile.txt" || echo "fused compile tests: failed (see $OUT/tests_fused_compile.txt)"
# K = 8 first: it compiles most members-running counts (of 1..8), so the smaller Ks compile little more (their
# untimed warm-ups take the rest), and a run cut short still has the K = 8 row.
timeout 240 python3 benchmarks/fused.py --space paper-small-offline --device cuda --dtype bf16 --compile --widths 128 \
  --ks 8,4,2,1 --threads 1 --steps 20 --masking-k 0 --out "$OUT/fused_paper_small.json" \
  || echo "fused benchmark: exit $? (rows measured so far are in $OUT/fused_paper_small.json)"
echo "fused: $((SECONDS - t0)) s"
rm -rf "$work"
