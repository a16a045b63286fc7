"""The Python API: README's example runs as written (on the tiny test space instead of the default one), and
importing the library leaves the caller's Optuna logging as it was."""

import re
import subprocess
import sys

import optuna
import pytest
from conftest import ROOT, TINY_SPACE
from helpers import HANG_SECONDS


def readme_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Python API") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_the_readme_python_api_example_runs(tmp_path, monkeypatch, token_cache, capsys, one_usable_core):
    code = readme_example()
    space_call = 'load_space("default", {"model": {"layers": 4}})'
    assert space_call in code and "n_trials=8" in code  # what is replaced below is still in the example
    # the tiny space (24 steps) of a narrow model, no reference runs, and fewer trials, as on one core (no worker
    # processes, conftest.one_core): the same calls, quickly
    tiny = {"search": {"noise_seeds": 0, "families": ["ilr"]}, "model": {"d_model": 16, "seq_len": 32}}
    code = code.replace(space_call, f"load_space({str(TINY_SPACE)!r}, {tiny!r})")
    code = code.replace("n_trials=8", "n_trials=3")
    monkeypatch.chdir(tmp_path)  # mine.db and the checkpoints go under the test's folder
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    report = namespace["report"]
    assert report.study == "mine" and report.n_trials == 3 and report.to_json()["n_trials"] == 3
    assert report.answer.line.startswith(("use ", "no map beat", "no decision yet"))
    audit = namespace["audit"].to_json()
    assert audit["study"] == "mine" and audit["factor"] == 4
    assert (tmp_path / "mine.db").exists()


IMPORT_EVERY_MODULE = """
import importlib, pkgutil, sys
import optuna
import pytest
import ilr_search

optuna.logging.set_verbosity(optuna.logging.WARNING)  # neither Optuna's default nor the CLI's
names = [m.name for m in pkgutil.walk_packages(ilr_search.__path__, "ilr_search.") if m.name != "ilr_search.__main__"]
for name in names:
    importlib.import_module(name)
assert "ilr_search.commands.api" in sys.modules and len(names) > 50, names
print(optuna.logging.get_verbosity())
"""


def test_importing_the_library_leaves_optunas_logging_alone():
    """A program using the Python API keeps its own Optuna log level: no module of the package (the API, the
    search, the CLI's modules) sets it on import; only a CLI command does, as it starts. A fresh process, so that
    what other tests imported or set does not count."""
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERY_MODULE], cwd=ROOT, capture_output=True, text=True, timeout=HANG_SECONDS
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split()[-1]) == optuna.logging.WARNING
