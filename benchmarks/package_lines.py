"""The package's lines by feature: what each capability the CLI contract and the issues ask for costs in ilr_search/.

    python benchmarks/package_lines.py [--markdown]

Counts every line of each module (as `find ilr_search -name '*.py' | xargs cat | wc -l` does) and its code lines
(no blank line, comment or docstring), and sums them over the features below; a module not named in FEATURES is
reported under "unassigned", so a new module shows up rather than vanishing from the table.
"""

from __future__ import annotations

import argparse
import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ilr_search"

# Feature -> modules (paths under ilr_search/, a trailing / for a whole folder). Each module in exactly one.
FEATURES: dict[str, tuple[str, ...]] = {
    "the ILR model, maps, FLOPs and the training engine": (
        "training/model.py",
        "training/train.py",
        "training/fused.py",
        "training/loss.py",
        "training/flops.py",
        "training/schedule.py",
        "training/device.py",
        "training/checkpoint.py",
        "training/build.py",
        "training/jobs.py",
        "training/__init__.py",
        "knobs.py",
        "records.py",
    ),
    "the learned schedule (--learn)": ("training/learned.py", "search/learn.py"),
    "pretrained checkpoints: frozen evaluation, GGUF, transformers export, judge": (
        "training/pretrained.py",
        "training/frozen.py",
        "training/gguf.py",
        "commands/export.py",
        "commands/standard_checkpoint.py",
        "commands/judge.py",
    ),
    "mergekit passthrough configs (read and write)": ("training/mergekit.py",),
    "task items and lm-eval tasks (--objective choice, exact or lm-eval)": ("data/items.py", "training/lm_eval_items.py"),
    "data: corpora, tokenizers, token cache": ("data/",),
    "search: Optuna study, samplers, pruning, plan, trial groups": (
        "search/__init__.py",
        "search/maps.py",
        "search/phases.py",
        "search/plan.py",
        "search/progress.py",
        "search/pruners.py",
        "search/run.py",
        "search/samplers.py",
        "search/studies.py",
        "search/trial_groups.py",
    ),
    "the race (adaptive) and its statistics": (
        "analysis/adaptive_race.py",
        "analysis/race_core.py",
        "analysis/sequential.py",
        "analysis/unit_pairs.py",
        "analysis/stats.py",
        "analysis/replicates.py",
        "analysis/racing.py",
        "analysis/race_report.py",
        "search/race.py",
        "search/race_results.py",
    ),
    "the fixed race (--race-policy fixed, studies made before the adaptive race)": ("analysis/fixed_race.py",),
    "storage: SQL and journal ledgers, Optuna storage, the one-shot import": ("storage/", "commands/migrate.py"),
    "the answer, reports and figures": (
        "analysis/plots.py",
        "analysis/page.py",
        "analysis/pareto.py",
        "analysis/results.py",
        "analysis/answer.py",
        "analysis/blocks.py",
        "analysis/__init__.py",
        "commands/report.py",
    ),
    "audit and proxy fidelity": ("commands/audit.py", "analysis/fidelity.py"),
    "settings: space, typed options, stored configuration": ("config.py", "options.py", "space.py"),
    "command line and printers": ("cli/", "__main__.py"),
    "running: workers, fuse layout, time budget, dry run, interrupts": (
        "commands/run.py",
        "commands/workers.py",
        "commands/layout.py",
        "commands/autofuse.py",
        "time_budget.py",
        "commands/dryrun.py",
        "interrupts.py",
        "commands/events.py",
        "commands/logs.py",
    ),
    "recipe and train --from-study": ("commands/recipe.py",),
    "experiment tracking (--track)": ("commands/tracking.py",),
    "bench build and bench replay --table": ("commands/bench/",),
    "Python API, errors, folders": (
        "__init__.py",
        "commands/__init__.py",
        "commands/api.py",
        "commands/studies.py",
        "errors.py",
        "folders.py",
    ),
}


def code_lines(source: str) -> int:
    """Lines holding code: not blank, not only a comment, not part of a docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            continue
        if tok.type == tokenize.ENDMARKER:
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return len(lines - docstrings)


def feature_of(module: str) -> str:
    for feature, paths in FEATURES.items():
        if any(module == p or (p.endswith("/") and module.startswith(p)) for p in paths):
            return feature
    return "unassigned"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--markdown", action="store_true", help="a markdown table instead of plain columns")
    args = ap.parse_args()
    totals: dict[str, list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        module = path.relative_to(PACKAGE).as_posix()
        row = totals.setdefault(feature_of(module), [0, 0, 0])
        row[0] += 1
        row[1] += len(source.splitlines())
        row[2] += code_lines(source)
    rows = sorted(totals.items(), key=lambda kv: -kv[1][1])
    all_lines, all_code = sum(r[1] for _, r in rows), sum(r[2] for _, r in rows)
    if args.markdown:
        print("| feature | modules | lines | code lines |\n| --- | ---: | ---: | ---: |")
        for feature, (n, lines, code) in rows:
            print(f"| {feature} | {n} | {lines:,} | {code:,} |")
        print(f"| **all** | {sum(r[0] for _, r in rows)} | **{all_lines:,}** | **{all_code:,}** |")
    else:
        for feature, (n, lines, code) in rows:
            print(f"{lines:6d} {code:6d}  {n:3d}  {feature}")
        print(f"{all_lines:6d} {all_code:6d}  all")


if __name__ == "__main__":
    main()
