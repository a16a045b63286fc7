"""README's "Python API" example runs as written, on the tiny test space instead of the default one."""

import re

from conftest import ROOT, TINY_SPACE


def readme_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_python_api_example_runs(tmp_path, monkeypatch, token_cache, capsys):
    code = readme_example()
    space_call = 'load_space("default", {"model": {"layers": 4}})'
    assert space_call in code and "n_trials=8" in code  # what is replaced below is still in the example
    # the tiny space (24 steps), no reference runs, and fewer trials: the same calls, quickly
    code = code.replace(space_call, f'load_space({str(TINY_SPACE)!r}, {{"search": {{"noise_seeds": 0, "families": ["ilr"]}}}})')
    code = code.replace("n_trials=8", "n_trials=3")
    monkeypatch.chdir(tmp_path)  # mine.db and the checkpoints go under the test's folder
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["summary"]["study"] == "mine" and namespace["summary"]["n_trials"] == 3
    assert namespace["audit"]["study"] == "mine" and namespace["audit"]["factor"] == 4
    assert (tmp_path / "mine.db").exists()
