import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pg"]

ROOT = Path(__file__).resolve().parent.parent

# Tests never reach a hub: the embedded corpus and byte/BPE tokenizers serve them.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory) -> Path:
    """One token cache for the whole session (the embedded corpus is tokenized once)."""
    path = tmp_path_factory.mktemp("token-cache")
    os.environ["ILR_SEARCH_CACHE"] = str(path)
    return path


@pytest.fixture
def cli(token_cache, tmp_path):
    """Run the real `ilr-search` console entry point in a subprocess; returns CompletedProcess."""

    def run(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300, check: bool = False):
        full_env = {**os.environ, "ILR_SEARCH_CACHE": str(token_cache), **(env or {})}
        proc = subprocess.run([sys.executable, "-m", "ilr_search", *args], cwd=cwd or tmp_path, env=full_env,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"ilr-search {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
        return proc

    return run


def assert_one_line_error(proc) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
