"""Small things of the command line: flags show no type in --help, tables at 80 columns keep maps and study
names whole, an override's error names the flag, no blank line comes before an `error:` line, and --help loads
neither Optuna nor torch while a command sets Optuna's logging."""

import io
import os
import subprocess
import sys

import pytest
from rich.console import Console

from conftest import ROOT, assert_one_line_error


@pytest.mark.parametrize("command", [[], ["run", "--budget", "2x"], ["train"], ["recipe"], ["bench", "build"]])
def test_flags_show_no_bool_metavar(cli, command):
    proc = cli(*command, "--help", check=True)
    assert "--help" in proc.stdout and "<bool>" not in proc.stdout


def test_tables_at_80_columns_keep_maps_and_study_names_whole(monkeypatch):
    from ilr_search.cli import ui

    console = Console(width=80, file=io.StringIO(), record=True)
    monkeypatch.setattr(ui, "out", console)
    maps = [[4, 2, 1, 1, 1, 1, 1, 1], [1, 3, 2, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]]
    names = ["ilr-L8-d32-rope-stdlib-byte-1.5x-838912f6", "ilr-L8-d32-rope-stdlib-bpe1024-2x-12345678"]
    rows = [{"trial": i, "state": "COMPLETE", "reuse_map": m, "knobs": "injection=add,iteration_norms" if i else None,
             "flops_ratio": 1.476, "val_ppl": 5.8234, "val_bpb": 1.234, "steps": 1000, "pruned_at_step": None}
            for i, m in enumerate(maps)]
    ui.print_trials({"study": names[0], "trials": rows})
    ui.print_studies({"studies": [{"study": n, "n_trials": 18, "n_complete": 13, "budget": "1.5x", "layers": 8,
                                   "best_val_ppl": 5.812} for n in names]})
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    for m in maps:
        assert sum(",".join(map(str, m)) in line for line in lines) == 1
    for n in names:
        assert any(n in line for line in lines)
    for number in ("5.823", "1.476", "1000"):  # values are never split either
        assert number in text


def test_a_bad_override_names_the_flag_not_the_space_file(cli):
    proc = cli("flops", "--layers", "0")
    assert_one_line_error(proc)
    assert "--layers 0" in proc.stderr and "default.toml" not in proc.stderr
    proc = cli("flops", "--heads", "3")
    assert_one_line_error(proc)
    assert "--heads 3" in proc.stderr and "default.toml" not in proc.stderr


def test_a_bad_space_file_is_still_named(cli, tmp_path):
    (tmp_path / "bad.toml").write_text("[model]\nlayers = 0\n")
    proc = cli("flops", "--space", str(tmp_path / "bad.toml"), "--d-model", "64")
    assert_one_line_error(proc)
    assert "bad.toml" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("args", [["train", "--steps", "0"], ["run", "--budget", "0.5x"],
                                  ["audit", "--factor", "0"], ["bench", "build", "--space", "bench-small", "--out", "x.txt"]])
def test_no_blank_line_before_an_error(console, tmp_path, args):
    proc = console(*args, "--storage", f"sqlite:///{tmp_path / 'r.db'}") if args[0] in ("run", "audit") else console(*args)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: "), repr(proc.stderr)


MAIN_THEN_LOADED = """
import sys
from ilr_search.cli.main import main
sys.argv = ["ilr-search", *sys.argv[1:]]
try:
    main()
except SystemExit as e:
    assert e.code in (0, None), e.code
loaded = [name for name in ("optuna", "torch") if name in sys.modules]
import optuna
print("loaded:", *loaded, "optuna verbosity:", optuna.logging.get_verbosity())
"""


@pytest.mark.parametrize("args, printed", [
    (["--help"], "loaded: optuna verbosity: 20"),  # help loads neither Optuna nor torch (20: Optuna's default)
    (["run", "--help"], "loaded: optuna verbosity: 20"),
    (["studies", "--storage", "sqlite:///none.db"], "loaded: optuna optuna verbosity: 40"),  # a command: errors only
])
def test_help_loads_no_optuna_and_a_command_quiets_it(tmp_path, args, printed):
    proc = subprocess.run([sys.executable, "-c", MAIN_THEN_LOADED, *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == printed
