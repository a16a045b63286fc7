"""Every status word and column header the CLI prints is defined in docs/concepts.md's glossary: read from the code
(the comparison statuses, the front's and the studies' words, the trial states, and every table's headers in
cli/ui.py), so a new word or column without a definition fails here."""

import ast

from conftest import ROOT
from optuna.trial import TrialState

from ilr_search.analysis.race_core import COMPARISON_STATUSES
from ilr_search.analysis.replicates import FROZEN_UNITS, SCORE_COLUMNS
from ilr_search.cli import ui
from ilr_search.search.studies import DECIDED_WORDS


def glossary() -> str:
    text = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    return text[text.index("## Glossary") :]


def _strings(node: ast.AST) -> list[str] | None:
    """The strings of a list literal of constants, or of a module constant of ui.py; None for anything else."""
    if isinstance(node, ast.Name):
        value = getattr(ui, node.id, None)
        return list(value) if isinstance(value, (list, tuple)) else None
    if isinstance(node, ast.List):
        return [e.value for e in node.elts if isinstance(e, ast.Constant)]
    return None


def _headers(node: ast.AST | None) -> dict[str, str]:
    if node is None:
        return {}
    if isinstance(node, ast.Name):
        return dict(getattr(ui, node.id))
    if isinstance(node, ast.Dict):
        return {
            k.value: v.value
            for k, v in zip(node.keys, node.values, strict=True)
            if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
        }
    return {}


def table_headers() -> set[str]:
    """Every header a table of cli/ui.py shows (rows_table's columns, renamed by its headers; the current front's
    columns; the knobs column a study with knobs adds)."""
    tree = ast.parse((ROOT / "ilr_search" / "cli" / "ui.py").read_text(encoding="utf-8"))
    found = {"knobs", *ui.FRONT_COLUMNS}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "rows_table":
            columns = _strings(node.args[2])
            assert columns is not None, ast.unparse(node.args[2])
            renamed = _headers(node.args[3] if len(node.args) > 3 else None)
            found |= {renamed.get(c, c) for c in columns}
    return found


def test_every_table_header_is_in_the_glossary():
    headers = table_headers()
    assert {"reuse_map", "FLOPs", "90% interval", "test seeds", "loss_diff", "status", "decided"} <= headers
    text = glossary()
    missing = sorted(h for h in headers if f"`{h}`" not in text)
    assert not missing, f"not defined in docs/concepts.md's glossary: {missing}"


def test_every_frozen_unit_and_score_column_is_in_the_glossary():
    """The headers a frozen study's tables take from its words (analysis/replicates.py): its chunks and its score
    column."""
    text = glossary()
    words = [
        *(f"{u}s" for u in FROZEN_UNITS),
        *(f"test {u}s" for u in FROZEN_UNITS),
        *SCORE_COLUMNS,
        "map",
        "chunks",
        "score",
    ]
    missing = [w for w in words if f"`{w}`" not in text]
    assert not missing, f"not defined in docs/concepts.md's glossary: {missing}"


def test_every_status_word_is_in_the_glossary():
    words = [
        *COMPARISON_STATUSES,
        *ui.CONFIRMED_WORDS,
        *DECIDED_WORDS,
        *(
            s.name
            for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING)
        ),
        "use",
        "no map beat",
        "no decision yet",
        "better by",
        "worse by",
        "trust",
        "eliminated",
    ]
    text = glossary()
    missing = [w for w in words if f"`{w}`" not in text]
    assert not missing, f"not defined in docs/concepts.md's glossary: {missing}"
    # a futility stop is `cannot win`, not a claim that a map is worse; `worse` is a claim, by the test run the other
    # way
    assert "not a test" in COMPARISON_STATUSES["cannot win"] and COMPARISON_STATUSES["worse"].startswith(
        "claimed worse"
    )
