"""Small things of the command line: flags show no type in --help, tables at 80 columns keep maps and study
names whole, an override's error names the flag, no blank line comes before an `error:` line, --help loads
neither Optuna nor torch while a command sets Optuna's logging; --version, a budget without its `x`, a space
of the wrong types, maps above max_reuse in flops and train, run and its dry run refusing the same input, and
flops without the training's flags."""

import io
import json
import os
import re
import subprocess
import sys
from importlib import metadata

import pytest
from conftest import NO_REFERENCES, TINY_SPACE, assert_one_line_error, run_cli, write_space
from helpers import BAD_ENQUEUES, HANG_SECONDS, Imported, imported_by, run_args
from rich.console import Console


@pytest.mark.parametrize("command", [[], ["run", "--budget", "2x"], ["train"], ["recipe"], ["bench", "build"]])
def test_flags_show_no_bool_metavar(cli, command):
    proc = cli(*command, "--help", check=True)
    assert "--help" in proc.stdout and "<bool>" not in proc.stdout


def test_tables_at_80_columns_keep_maps_and_study_names_whole(monkeypatch):
    from optuna.trial import TrialState

    from ilr_search.analysis.answer import Answer
    from ilr_search.analysis.fidelity import Fidelity
    from ilr_search.analysis.results import TrialRow
    from ilr_search.cli import ui
    from ilr_search.search.studies import StudyListing, StudyReport, StudySummary, TrialListing
    from ilr_search.storage.trials import TrialRecord

    console = Console(width=80, file=io.StringIO(), record=True)
    monkeypatch.setattr(ui, "out", console)
    maps = [[4, 2, 1, 1, 1, 1, 1, 1], [1, 3, 2, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]]
    names = ["ilr-L8-d32-rope-stdlib-byte-1.5x-838912f6", "ilr-L8-d32-rope-stdlib-bpe1024-2x-12345678"]
    knobs = {"injection": "add", "iteration_norms": True}
    rows = [
        TrialRow(
            TrialRecord(
                i,
                TrialState.COMPLETE,
                reuse_map=tuple(m),
                knobs=knobs if i else {},
                flops_ratio=1.476,
                val_ppl=5.8234,
                val_bpb=1.234,
                steps=1000,
            ),
            (),
            (),
        )
        for i, m in enumerate(maps)
    ]
    answer = Answer(
        "use 4,2,1,1,1,1,1,1: 0.08 ppl better than the plain model (90% interval 0.03 to 0.13), 6 seeds at 2000 steps",
        ("closest contender: 1,3,2,1,1,1,1,1 better by 0.02 ppl than the plain model",),
    )
    ui.print_trials(
        StudyReport(
            study=names[0],
            storage="sqlite:///s.db",
            trials=(),
            references={},
            race=None,
            fidelity=Fidelity((), None, None, None, (), ""),
            answer=answer,
            listing=TrialListing(tuple(rows), (), ()),
        )
    )
    ui.print_studies(
        StudyListing(tuple(StudySummary(n, 18, 13, "1.5x", 8, None, 5.812, None, answer.line) for n in names))
    )
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[0].startswith("use 4,2,1,1,1,1,1,1: ")  # the answer first, wrapped at the width
    for m in maps:
        assert sum(",".join(map(str, m)) in line and "│" in line for line in lines) == 1
    for n in names:
        assert any(n in line for line in lines)
    for number in ("5.823", "1.48x", "1000"):  # values are never split either
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
@pytest.mark.parametrize(
    "args",
    [
        ["train", "--steps", "-1"],
        ["run", "--budget", "0.5x"],
        ["audit", "--factor", "0"],
        ["bench", "build", "--space", "bench-small", "--out", "x.txt"],
    ],
)
def test_no_blank_line_before_an_error(cli, tmp_path, args):
    proc = cli(*args, "--storage", f"sqlite:///{tmp_path / 'r.db'}") if args[0] in ("run", "audit") else cli(*args)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: "), repr(proc.stderr)


@pytest.mark.parametrize(
    "args, loaded, verbosity",
    [
        (["--help"], (), 20),  # help loads neither Optuna nor torch (20: Optuna's default)
        (["run", "--help"], (), 20),
        (["studies", "--storage", "sqlite:///none.db"], ("optuna",), 40),  # a command: errors only
    ],
)
def test_help_loads_no_optuna_and_a_command_quiets_it(tmp_path, args, loaded, verbosity):
    import optuna

    optuna.create_study(
        study_name="s", storage=f"sqlite:///{tmp_path / 'none.db'}"
    )  # studies reads a storage that exists
    assert imported_by(args, tmp_path) == Imported(loaded, verbosity)


def test_version_prints_the_installed_version(cli):
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout == f"ilr-search {metadata.version('ilr-search')}\n"


@pytest.mark.parametrize("text", ["1.5", "2", "99", "1e1"])
def test_a_bare_small_budget_asks_for_its_x(text):
    from ilr_search.config import ModelConfig
    from ilr_search.training.flops import BudgetError, parse_budget

    with pytest.raises(BudgetError, match=f"did you mean {text}x\\?"):
        parse_budget(text, ModelConfig())
    with pytest.raises(BudgetError, match="below the plain model's"):  # FLOPs, too few for any model
        parse_budget("150", ModelConfig())


def test_run_refuses_a_bare_budget_and_writes_nothing(cli, tmp_path):
    proc = cli("run", "--space", str(TINY_SPACE), "--budget", "1.5", "--storage", f"sqlite:///{tmp_path / 'r.db'}")
    assert_one_line_error(proc)
    assert "did you mean 1.5x?" in proc.stderr
    assert list(tmp_path.iterdir()) == []


WRONG_TYPES = [  # (section, key, value, the expected type in words)
    ("model", "layers", "eight", "an integer"),
    ("model", "mlp_ratio", "4", "a number"),
    ("train", "steps", 2.5, "an integer"),
    ("train", "batch_size", True, "an integer"),
    ("train", "compile", "yes", "true or false"),
    ("train", "eval_fractions", [0.5, "end"], "a list of numbers"),
    ("data", "tokenizer", 256, "a string"),
    ("search", "fuse", [4], "an integer or a string"),
    ("search", "knobs", "injection", "a list of strings"),
]


@pytest.mark.parametrize("section,key,value,expected", WRONG_TYPES)
def test_a_space_of_the_wrong_type_names_the_key_and_the_type(cli, tmp_path, section, key, value, expected):
    space = write_space(tmp_path / "typed.toml", **{section: {key: value}})
    proc = cli("flops", "--space", str(space))
    assert_one_line_error(proc)
    assert f"[{section}]" in proc.stderr and "typed.toml" in proc.stderr
    assert f"{key} must be {expected}, got" in proc.stderr


def test_a_space_takes_integers_for_numbers(cli, tmp_path):
    space = write_space(tmp_path / "ints.toml", model={"mlp_ratio": 4}, train={"lr": 1, "eval_fractions": [1]})
    assert cli("flops", "--space", str(space), check=True).returncode == 0


def test_flops_and_train_refuse_counts_above_max_reuse_as_run_does(cli, tmp_path):
    space = write_space(tmp_path / "space.toml", search=NO_REFERENCES)  # max_reuse 3
    shared = "a layer runs 4 times, above the space's max_reuse 3"
    run = cli(*run_args(space, tmp_path / "r.db", "q", "--enqueue", "4,1,1,1", budget="2x", steps=8, n_trials=2))
    assert_one_line_error(run)
    assert shared in run.stderr
    for command in ("flops", "train"):
        proc = cli(command, "--space", str(space), "--reuse-map", "4,1,1,1")
        assert_one_line_error(proc)
        assert shared in proc.stderr and "4,1,1,1" in proc.stderr
    assert cli("flops", "--space", str(space), "--reuse-map", "3,1,1,1", check=True).returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.toml"]


BAD_RUN_INPUTS = [["--enqueue", text] for _, text in sorted(BAD_ENQUEUES.items())] + [
    ["--enqueue", "2,1,1,1 5,1,1,1"],
    ["--budget", "1.5"],
    ["--n-trials", "0"],
    ["--knobs", "wings"],
]


@pytest.mark.parametrize("bad", BAD_RUN_INPUTS, ids=" ".join)
def test_run_and_its_dry_run_refuse_the_same_input(cli, tmp_path, bad):
    space = write_space(tmp_path / "space.toml", search=NO_REFERENCES)
    args = run_args(
        space, tmp_path / "r.db", "q", *bad, budget="2x", steps=8, n_trials=2
    )  # a later --budget or --n-trials wins over run_args'
    refused = [cli(*args), cli(*args, "--dry-run")]
    for proc in refused:
        assert_one_line_error(proc)
    assert refused[0].stderr == refused[1].stderr
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["space.toml"]


TRAINING_FLAGS = [
    "--steps",
    "--batch-size",
    "--lr",
    "--seed",
    "--device",
    "--dtype",
    "--compile",
    "--data",
    "--text-column",
]


def test_flops_takes_the_model_options_only(cli):
    flops = cli("flops", "--help", check=True).stdout
    assert not [flag for flag in TRAINING_FLAGS if flag in flops]
    assert all(
        flag in flops
        for flag in (
            "--space",
            "--layers",
            "--d-model",
            "--heads",
            "--seq-len",
            "--mlp-ratio",
            "--pe",
            "--tokenizer",
            "--reuse-map",
            "--block",
            "--knobs",
        )
    )
    train = cli("train", "--help", check=True).stdout
    assert all(flag in train for flag in TRAINING_FLAGS + ["--layers", "--tokenizer"])
    assert_one_line_error(cli("flops", "--steps", "10"))


HUGE = "99999999999999999999"  # beyond a 64-bit integer
TOO_LARGE = [  # (arguments, what the error says): every size refused before anything is allocated or trained
    (["flops", "--layers", HUGE], "layers must be at most 1,024"),
    (["flops", "--layers", "10000000"], "layers must be at most 1,024"),
    (["flops", "--d-model", "131072", "--heads", "4"], "d_model must be at most 65,536"),
    (["flops", "--seq-len", HUGE], "seq_len must be at most 1,048,576"),
    (["flops", "--block", HUGE], "above the space's max_reuse"),
    (["train", "--steps", HUGE], "steps must be at most 1,000,000,000"),
    (["train", "--batch-size", HUGE], "batch_size must be at most 65,536"),
    (["run", "--budget", "2x", "--n-trials", HUGE], "at most 100,000"),
    (["run", "--budget", "2x", "--workers", HUGE], "--workers must be 1 to 1,024"),
    (["run", "--budget", "2x", "--fuse", HUGE], "at most 1,024"),
    (["run", "--budget", "2x", "--target", "1e300x"], "must be at most 1,000,000,000 steps"),
    (["run", "--budget", "2x", "--race-seeds", HUGE], "race_seeds must be at most 1,000"),
]


@pytest.mark.parametrize("args, says", TOO_LARGE, ids=lambda a: " ".join(a) if isinstance(a, list) else None)
def test_sizes_above_their_maximum_are_one_error_line(cli, tmp_path, args, says):
    storage = ["--storage", f"sqlite:///{tmp_path / 'r.db'}"] if args[0] == "run" else []
    proc = cli(*args, "--space", str(TINY_SPACE), *storage)
    assert_one_line_error(proc)
    assert says in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_space_file_above_a_maximum_is_refused_as_the_flag_is(cli, tmp_path):
    space = write_space(tmp_path / "big.toml", search={"max_reuse": 1000})
    proc = cli("flops", "--space", str(space))
    assert_one_line_error(proc)
    assert "max_reuse must be at most 64, got 1000" in proc.stderr and "big.toml" in proc.stderr


def test_studies_of_a_missing_storage_is_an_error_and_creates_nothing(cli, tmp_path):
    for command in ("studies", "trials"):
        proc = cli(command, "--storage", f"sqlite:///{tmp_path / 'missing.db'}")
        assert_one_line_error(proc)
        assert "does not exist yet" in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args",
    [
        ["pareto", "--out", "front.docx"],
        ["export", "--out", "trials.xlsx"],
        ["audit", "--factor", "0"],
        ["recipe", "--out", "recipe.docx"],
    ],
    ids=" ".join,
)
def test_the_default_study_is_not_announced_before_an_error(cli, tmp_path, args):
    import optuna

    db = tmp_path / "s.db"
    optuna.create_study(study_name="only", storage=f"sqlite:///{db}")
    before = db.read_bytes()
    proc = cli(*args, "--storage", f"sqlite:///{db}")
    assert_one_line_error(proc)  # the error line alone: no "study only (the only study in ...)" line
    assert db.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["s.db"]


def test_a_mysql_storage_without_its_driver_names_a_mysql_driver(cli):
    proc = cli("studies", "--storage", "mysql://user@127.0.0.1:9/db")
    assert_one_line_error(proc)
    assert "mysqlclient" in proc.stderr and "postgres" not in proc.stderr.lower()


# Run in one `python` process: ilr_search's entry point on each argv in turn (a failed one ends the process with its
# exit code), each command's output followed by a line of its own.
COMMANDS_IN_TURN = """
import json, sys
from ilr_search.cli.main import main
commands, end = json.loads(sys.argv[1]), sys.argv[2]
for args in commands:
    sys.argv = ["ilr-search", *args]
    try:
        main()
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    print(end, flush=True)
"""
END_OF_COMMAND = "-- end of command --"


def in_terminal(commands: list[list[str]], columns: int, cwd, env: dict) -> list[str]:
    """What `ilr-search ARGS` prints on stdout for each of `commands` (argument lists), run one after another by
    its entry point in one process in a real pseudo-terminal `columns` wide (COLUMNS set and the window size too);
    stderr goes to a pipe."""
    import fcntl
    import pty
    import struct
    import termios

    main, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-c", COMMANDS_IN_TURN, json.dumps(commands), END_OF_COMMAND],
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env={**env, "COLUMNS": str(columns), "LINES": "50"},
    )
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the process closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    _, stderr = proc.communicate(timeout=HANG_SECONDS)
    os.close(main)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    text = re.sub(r"\x1b\[[0-9;]*m", "", b"".join(chunks).decode().replace("\r\n", "\n"))  # no colours
    outputs = text.split(END_OF_COMMAND + "\n")
    assert len(outputs) == len(commands) + 1 and outputs[-1] == "", text
    return outputs[:-1]


@pytest.fixture(scope="module")
def eight_layer_study(tmp_path_factory, token_cache):
    """A real study of 8 layers (maps 15 characters wide) under its derived name (39 characters): 3 trials, no race."""
    root = tmp_path_factory.mktemp("wide")
    space = write_space(root / "space.toml", search=NO_REFERENCES)
    db = root / "s.db"
    env = {**os.environ, "ILR_SEARCH_CACHE": str(token_cache)}
    proc = run_cli(
        [
            "run",
            "--space",
            str(space),
            "--layers",
            "8",
            "--budget",
            "1.5x",
            "--steps",
            "4",
            "--n-trials",
            "3",
            "--storage",
            f"sqlite:///{db}",
            "--json",
        ],
        root,
        {"ILR_SEARCH_CACHE": str(token_cache)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    trials = json.loads(run_cli(["trials", "--storage", f"sqlite:///{db}", "--json"], root).stdout)["trials"]
    return root, db, env, summary["study"], [",".join(map(str, t["reuse_map"])) for t in trials]


@pytest.mark.parametrize("columns", [80, 120])
def test_tables_in_a_terminal_keep_the_study_name_and_maps_whole(eight_layer_study, columns):
    root, db, env, study, maps = eight_layer_study
    assert len(study) >= 36 and all(len(m) == 15 for m in maps)
    commands = ("studies", "trials", "pareto")
    outputs = in_terminal([[command, "--storage", f"sqlite:///{db}"] for command in commands], columns, root, env)
    texts = dict(zip(commands, outputs, strict=True))
    for command, text in texts.items():
        lines = text.splitlines()
        assert max(len(line) for line in lines if line[:1] in "┏┃┡│└") <= columns, text  # (a verdict line soft-wraps)
        assert any(study in line for line in lines), text  # the name --study takes, unbroken
        if command == "trials":
            for m in maps:
                assert sum(m in line for line in lines) >= 1, (m, text)
        for line in lines:
            if line.startswith("┃"):  # a header row: words folded whole, never a letter a line
                cells = [c.strip() for c in line.strip("┃").split("┃")]
                assert all(len(c) != 1 or c in ("p", "n") for c in cells), line
                assert not any("_" in c for c in cells), line
    assert "1.00x" in texts["pareto"]
