"""A resumed study is checked the same way whether a setting comes from a flag or from the space's TOML."""

import pytest
from conftest import ROOT, assert_one_line_error

BASE = (
    (ROOT / "tests" / "spaces" / "tiny.toml")
    .read_text(encoding="utf-8")
    .replace("noise_seeds = 2", 'noise_seeds = 0\nfamilies = ["ilr"]')
)
ARGS = [
    "--layers",
    "2",
    "--d-model",
    "16",
    "--seq-len",
    "32",
    "--steps",
    "4",
    "--budget",
    "2x",
    "--study",
    "s",
    "--storage",
    "sqlite:///s.db",
]


def _space(tmp_path, name: str, extra: str, eta: str = "2.0") -> str:
    path = tmp_path / f"{name}.toml"
    text = BASE.replace("[search]", "[search]\n" + extra).replace("prune_eta = 2.0", f"prune_eta = {eta}")
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.slow
def test_toml_sampler_and_pruning_settings_are_checked_on_resume(cli, tmp_path):
    first = _space(tmp_path, "first", 'sampler = "random"')
    cli("run", "--space", first, *ARGS, "--n-trials", "1", check=True)
    db = (tmp_path / "s.db").read_bytes()
    for name, extra, eta, named in [
        ("sampler", 'sampler = "tpe"', "2.0", "sampler"),
        ("eta", 'sampler = "random"', "4.0", "prune_eta"),
        ("spearman", 'sampler = "random"\nprune_min_spearman = 0.9', "2.0", "prune_min_spearman"),
    ]:
        proc = cli("run", "--space", _space(tmp_path, name, extra, eta), *ARGS, "--n-trials", "2")
        assert_one_line_error(proc)
        assert "cannot resume" in proc.stderr and named in proc.stderr, proc.stderr
        assert (tmp_path / "s.db").read_bytes() == db  # refused before anything was written
    cli("run", "--space", first, *ARGS, "--n-trials", "2", check=True)  # the same settings resume
