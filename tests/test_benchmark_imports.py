"""Every name a benchmark script imports from the package (or from benchmarks/replays/, their shared replays) exists:
a script left behind by a refactor fails here, not the day someone reruns it for a report."""

import ast
import importlib

import pytest
from conftest import ROOT

SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def package_imports(path):
    """(module, name) for each `from ilr_search... import name` (or `from replays... import name`) in the script, at
    any depth."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(("ilr_search", "replays")):
            for alias in node.names:
                yield node.module, alias.name


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_every_package_name_a_benchmark_imports_exists(script):
    missing = []
    for module_name, name in package_imports(script):
        module = importlib.import_module(module_name)
        if not hasattr(module, name):
            try:
                importlib.import_module(f"{module_name}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{module_name}.{name}")
    assert not missing, f"{script.name} imports names the package no longer has: {missing}"


def test_the_check_sees_the_scripts():
    names = [name for script in SCRIPTS for _, name in package_imports(script)]
    assert len(SCRIPTS) > 20 and len(names) > 50
