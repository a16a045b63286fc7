"""The `ilr-search` command line: thin commands over the library (commands/); it only parses, and docs/cli.md lists
every command and option."""

import atexit
import dataclasses
import functools
import inspect
import json
import logging
import os
import sys
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from ilr_search.cli import live, ui
from ilr_search.errors import UserInputError
from ilr_search.interrupts import recorded
from ilr_search.options import (
    JUDGE_SPACE_OPTIONS,
    AuditOptions,
    BenchBuildOptions,
    BenchReplayOptions,
    ExportModelOptions,
    ExportOptions,
    FlopsOptions,
    JudgeOptions,
    ModelOptions,
    ParetoOptions,
    RecipeOptions,
    RunOptions,
    SpaceOptions,
    StudyChoice,
    TrainOptions,
    check_init_flags,
)

if TYPE_CHECKING:
    from ilr_search.commands.run import RunRequest

try:  # typer >= 0.2x vendors click (Python >= 3.11); older typer uses click itself
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover
    from click import exceptions as click_exceptions  # type: ignore[no-redef]  # one of the two imports runs

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Search per-layer recurrence (reuse maps) of transformer LMs under a FLOP budget.",
)


def package_version() -> str:
    """The installed distribution's version; the package's own __version__ where it is not installed."""
    from importlib import metadata

    try:
        return metadata.version("ilr-search")
    except metadata.PackageNotFoundError:
        import ilr_search

        return getattr(ilr_search, "__version__", "unknown")


def print_version(asked: bool) -> None:
    if asked:
        print(f"ilr-search {package_version()}")
        raise typer.Exit(0)


@app.callback()
def application(
    version: Annotated[
        bool, typer.Option("--version", is_eager=True, callback=print_version, help="Print the version and exit.")
    ] = False,
) -> None:
    pass


# ----------------------------------------------------------------------------------------------------
# A command's options: the fields of its settings dataclass (options.py, each declared once with setting()), added to
# its signature. The space's options are shared: flops takes the model's (its shape and vocabulary: what its FLOPs
# depend on), train and run the training's too.


def option_parameters(
    settings: type, names: Iterable[str] | None = None, helps: Mapping[str, str] | None = None
) -> list[inspect.Parameter]:
    """The command-line options of a settings dataclass (options.setting fields; `names`: only those), as typer reads
    them from a signature: each its field's name, type, default and help (`helps` may say a field's help in the words
    of another command). The required options come first, the space's (SHARED) last."""
    hints = typing.get_type_hints(settings)
    fields = [f for f in dataclasses.fields(settings) if "help" in f.metadata and (names is None or f.name in names)]
    parameters = []
    for f in sorted(fields, key=lambda f: (f.name in space_options(settings), not is_required(f))):
        hint = hints[f.name]
        if Path in typing.get_args(hint):  # a path the Python API may also give as text
            hint = Path | None
        if typing.get_origin(hint) is Literal:  # its values checked by the settings, in their own words
            hint = str
        if typing.get_origin(hint) is tuple:  # a repeatable option
            hint = list[typing.get_args(hint)[0]]  # type: ignore[misc]  # a type built at run time
        flag = f.metadata["flag"]
        option = typer.Option(*([flag] if flag else []), help=(helps or {}).get(f.name) or f.metadata["help"])
        default = inspect.Parameter.empty if is_required(f) else f.default
        parameters.append(inspect.Parameter(f.name, KEYWORD, default=default, annotation=Annotated[hint, option]))
    return parameters


KEYWORD = inspect.Parameter.KEYWORD_ONLY


def is_required(f: "dataclasses.Field[Any]") -> bool:
    """Whether the command line must give a setting: required, or with no default."""
    return bool(f.metadata["required"]) or f.default is dataclasses.MISSING


def as_setting(value: Any) -> Any:
    """An option's value as its settings field holds it: a repeatable option's list as a tuple."""
    return tuple(value) if isinstance(value, list) else value


SHARED = {f.name for f in dataclasses.fields(SpaceOptions)}  # the space's options, listed after a command's own


def space_options(settings: type) -> set[str]:
    """The options of `settings` that are the space's (SHARED): none where its settings are not the space's."""
    return SHARED if issubclass(settings, ModelOptions) else set()


def with_settings(
    settings: type, names: Iterable[str] | None = None, helps: Mapping[str, str] | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator giving `command` the options of the dataclass `settings` (option_parameters) around its own
    parameters (the settings' own first, then the command's, then the space's); it
    receives them together as `opts`, one `settings` (the fields it has no option for at their defaults)."""
    parameters = option_parameters(settings, names, helps)

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = [p.replace(kind=KEYWORD) for name, p in inspect.signature(command).parameters.items() if name != "opts"]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            given = {p.name: as_setting(kwargs.pop(p.name)) for p in parameters}
            return command(opts=settings(**given), **kwargs)

        # inspect.signature (and so typer) reads __signature__, which typeshed does not declare on a function
        shared = space_options(settings)
        first = [p for p in parameters if p.name not in shared]
        rest = [p for p in parameters if p.name in shared]
        wrapper.__signature__ = inspect.Signature(first + own + rest)  # type: ignore[attr-defined]
        return wrapper

    return decorate


# judge's options: its own, and the space's it reads in its own words
with_judge_options = with_settings(
    JudgeOptions,
    [*(f.name for f in dataclasses.fields(JudgeOptions) if f.name not in SHARED), *JUDGE_SPACE_OPTIONS],
    JUDGE_SPACE_OPTIONS,
)


def user_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Bad input: one `error:` line on stderr and exit code 2. Every command has it, so it also sets the process's
    Optuna logging as the command starts (not in main(): --help loads no Optuna)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from ilr_search.commands.logs import quiet_optuna

        quiet_optuna()
        try:
            result = command(*args, **kwargs)
        except UserInputError as e:
            ui.held_notes.clear()
            fail(str(e))
        ui.release_notes()
        return result

    return wrapper


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(2)


def emit(obj: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    """Print a command's result: its JSON form (a dict, or a typed report's to_json()) with --json, else render it;
    the notes held until the command goes ahead are printed first."""
    ui.release_notes()
    if as_json:
        print(json.dumps(obj if isinstance(obj, dict) else obj.to_json(), default=float))
    else:
        render(obj)


Json = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]


# ----------------------------------------------------------------------------------------------------


@app.command()
@user_errors
@with_settings(FlopsOptions)
def flops(opts: FlopsOptions, json_out: Json = False) -> None:
    """Analytic forward FLOPs per token of a reuse map, and its ratio to the plain model's.

    train_flops counts the space's proxy training (its steps and batch size)."""
    from ilr_search.commands.api import flops_report

    check_init(opts, opts.init)
    report = flops_report(opts.space, opts.overrides(), opts.reuse_map, opts.block, opts.knobs, opts.init)
    emit(report, json_out, ui.print_flops)


def check_init(opts: ModelOptions, init: str | None) -> None:
    """The options --init refuses (config.check_init_flags), then its note held."""
    check_init_flags(opts.given(), init)
    hold_init_note(init)


def hold_init_note(init: str | None) -> None:
    """--init's note about its checkpoint (a quantized GGUF file), said once, when the command goes ahead."""
    from ilr_search.commands.api import init_note

    note = init_note(init)
    if note:
        ui.hold_note(note)


@app.command()
@user_errors
@with_settings(TrainOptions)
def train(opts: TrainOptions, json_out: Json = False) -> None:
    """Train one proxy model for a reuse map (or --block K) and report its validation perplexity."""
    from ilr_search.commands.api import train_command

    opts.check()
    hold_init_note(opts.init)
    with live.step_progress(enabled=True) as on_step:
        report = train_command(opts, on_step, lambda why: ui.hold_note(f"study {opts.from_study}: {why}"))
    emit(report, json_out, ui.print_train)
    if opts.save is not None and not json_out:
        ui.out.print(f"saved the model to {opts.save}")


def hide_flag_metavars(command: Any) -> None:
    """Flags take no value: typer's help would show them a `<bool>` type (even --help); show none."""
    help_option = command.get_help_option(typer.Context(command))
    for param in [*command.params, *([help_option] if help_option is not None else [])]:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        hide_flag_metavars(sub)


def main() -> None:
    """Entry point: click's usage errors become one `error:` line with exit code 2 too."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    command = typer.main.get_command(app)
    hide_flag_metavars(command)
    try:
        with recorded():
            code = command.main(standalone_mode=False)
    except click_exceptions.NoArgsIsHelpError as e:  # `ilr-search` alone prints the help
        print(e.ctx.get_help() if e.ctx else str(e))
        code = 0
    except click_exceptions.UsageError as e:
        print(f"error: {' '.join(e.format_message().split())}", file=sys.stderr)
        code = 2
    except typer.Abort:
        print("interrupted", file=sys.stderr)
        code = 130
    sys.exit(code if isinstance(code, int) else 0)


def console_main() -> None:
    """The console script and `python -m ilr_search`: `main`, then an exit without the interpreter's teardown.

    Every result is committed to the storage before a command returns, and the exit handlers (log flushing,
    child processes) still run. What is skipped is freeing torch's and pandas' module graphs one object at a
    time after the command's own work is done (benchmarks/reports/reliability_cpu-2core_2026-12-01.md times it).
    """
    try:
        main()
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@app.command()
@user_errors
@with_settings(RunOptions)
def run(opts: RunOptions, json_out: Json = False) -> None:
    """Search reuse maps under a FLOP budget; running it again resumes the study."""
    from ilr_search.commands.run import run_request

    request = run_request(opts)
    hold_init_note(opts.init)
    tracked_reporter(opts.track, opts.storage, open_uri=False)  # a bad --track is refused before the probe
    if opts.dry_run:
        from ilr_search.commands.dryrun import dry_run_report

        emit(dry_run_report(request), json_out, ui.print_plan)
        return
    tracked = tracked_reporter(opts.track, opts.storage)
    run_and_show(request, lambda: tracked(live.ConsoleReporter(enabled=True)), json_out, ui.print_run)


@app.command()
@user_errors
@with_judge_options
def judge(opts: JudgeOptions, json_out: Json = False) -> None:
    """Is a candidate (a map, a block, a mergekit config) better than the model it was made from? No search: raced
    against the model on held-out windows or items, paired, until decided; the same command resumes."""
    from ilr_search.commands.judge import judge_request

    check_init(opts, opts.init)
    request, candidates = judge_request(opts)
    baseline = ",".join("1" * request.space.model.n_layers)
    for c in candidates:
        ui.hold_note(c.line(baseline))
    run_and_show(request, lambda: live.ConsoleReporter(enabled=True), json_out, ui.print_judge)


def run_and_show(
    request: "RunRequest", shown_by: Callable[[], Any], json_out: bool, render: Callable[[Any], None]
) -> None:
    """Run the study of `request` (`run` or `judge`), its progress shown by the reporter `shown_by` makes and its
    notes on stderr; print the result; an interrupted run exits with 130."""
    from ilr_search.commands.run import run_study

    summary = run_study(
        request, shown_by=shown_by, note=lambda text: ui.err.print(text, soft_wrap=True, markup=False, highlight=False)
    )
    emit(summary, json_out, render)
    if summary.interrupted:
        raise typer.Exit(130)


def tracked_reporter(track: str | None, storage: str | None, open_uri: bool = True) -> Callable[[Any], Any]:
    """`run --track`: the reporter wrapped so that finished trials also go to the tracker (checked first)."""
    if track is None:
        return lambda reporter: reporter
    from ilr_search.commands.tracking import TrackingReporter, parse_track

    spec = parse_track(track, open_uri)
    return lambda reporter: TrackingReporter(reporter, spec, storage)


def study_or_default(opts: StudyChoice) -> str:
    """The study asked for, else the storage's only or most recently active one (named in a note)."""
    if opts.study:
        return opts.study
    from ilr_search.commands.studies import default_study

    name, why = default_study(opts.storage)
    ui.hold_note(f"study {name} ({why})")
    return name


@app.command()
@user_errors
@with_settings(StudyChoice, ["storage"])
def studies(opts: StudyChoice, json_out: Json = False) -> None:
    """List the studies in a storage."""
    from ilr_search.commands.studies import list_studies

    emit(list_studies(opts.storage), json_out, ui.print_studies)


@app.command()
@user_errors
@with_settings(StudyChoice)
def trials(opts: StudyChoice, json_out: Json = False) -> None:
    """List the trials of a study, and how far its proxy can be trusted."""
    from ilr_search.commands.studies import trials_report

    emit(trials_report(study_or_default(opts), opts.storage), json_out, ui.print_trials)


@app.command()
@user_errors
@with_settings(ParetoOptions)
def pareto(opts: ParetoOptions, json_out: Json = False) -> None:
    """The Pareto front of perplexity vs compute: a table, and a figure or table file with --out."""
    from ilr_search.commands.report import pareto_blocks, pareto_report

    if opts.view == "blocks":
        emit(pareto_blocks(study_or_default(opts), opts.storage, opts.out), json_out, ui.print_blocks)
        return
    emit(pareto_report(study_or_default(opts), opts.storage, opts.out, opts.view), json_out, ui.print_pareto)


@app.command()
@user_errors
@with_settings(ExportOptions)
def export(opts: ExportOptions, json_out: Json = False) -> None:
    """Write one row per trial (map, state, objectives, parameters, steps, pruning, durations), per reference run and per race run."""  # noqa: E501 -- typer lists the command by this paragraph, its line breaks kept
    from ilr_search.commands.report import export_trials

    report = export_trials(study_or_default(opts), opts.storage, opts.out, opts.curves)
    emit(report, json_out, ui.print_export)


@app.command()
@user_errors
@with_settings(AuditOptions)
def audit(opts: AuditOptions, json_out: Json = False) -> None:
    """Retrain chosen maps of a study FACTOR times longer and say how far the proxy's ranking holds (resumable)."""
    from ilr_search.commands.audit import run_audit
    from ilr_search.commands.autofuse import parse_fuse

    k = parse_fuse(opts.fuse)
    if k == "auto":
        raise UserInputError("audit --fuse takes a number of runs (auto is run's); e.g. --fuse 4")
    with live.ConsoleReporter(enabled=True) as reporter:
        report = run_audit(study_or_default(opts), opts.storage, opts, reporter, fuse=int(k))
    emit(report, json_out, ui.print_audit)


bench_app = typer.Typer(no_args_is_help=True, help="The tabular benchmark: every feasible map of a small space.")
app.add_typer(bench_app, name="bench")


@bench_app.command("build")
@user_errors
@with_settings(BenchBuildOptions)
def bench_build(opts: BenchBuildOptions, json_out: Json = False) -> None:
    """Train every feasible map of a small space and write the table (resumable: it is a study)."""
    from ilr_search.commands.bench import build_table

    with live.ConsoleReporter(enabled=True) as reporter:
        report = build_table(opts, reporter)
    emit(report, json_out, lambda r: ui.out.print(f"wrote {r.maps} maps to {r.out} (study {r.study})"))


@bench_app.command("replay")
@user_errors
@with_settings(BenchReplayOptions)
def bench_replay(opts: BenchReplayOptions, json_out: Json = False) -> None:
    """Replay a pruning rule over a table's rows: the maps it prunes, the steps it saves, the front maps it loses."""
    from ilr_search.commands.bench import replay_table

    emit(replay_table(opts.table, opts.pruner, opts.seed), json_out, ui.print_pruning_replay)


@app.command("export-model")
@user_errors
@with_settings(ExportModelOptions)
def export_model(opts: ExportModelOptions, json_out: Json = False) -> None:
    """Write a standard transformers checkpoint of a model under a map, its repeated layers unrolled, with its tokenizer (or a mergekit config that builds it)."""  # noqa: E501 -- typer lists the command by this paragraph, its line breaks kept
    from ilr_search.commands.export import export_checkpoint

    report = export_checkpoint(opts, lambda why: ui.hold_note(f"study {opts.study}: {why}"))
    emit(report, json_out, ui.print_export_model)


@app.command()
@user_errors
@with_settings(RecipeOptions)
def recipe(opts: RecipeOptions, json_out: Json = False) -> None:
    """Everything needed to train one map of a study elsewhere: model config, map, schedule, knobs, training and data settings, measured perplexities."""  # noqa: E501 -- typer lists the command by this paragraph, its line breaks kept
    from ilr_search.commands.recipe import RECIPE_FORMATS, recipe_text, study_recipe, write_recipe
    from ilr_search.commands.report import check_out_path

    path = check_out_path(opts.out, RECIPE_FORMATS) if opts.out is not None else None
    name = study_or_default(opts)
    report = study_recipe(name, opts.storage, opts.map_text, on_choice=lambda why: ui.hold_note(f"study {name}: {why}"))
    if path is not None:
        write_recipe(report, path)
    if json_out:
        print(json.dumps(report.to_json() | ({"out": str(path)} if path else {}), default=float))
    elif path is not None:
        ui.out.print(f"wrote the recipe of map {report.map} of study {name} to {path}")
    else:
        sys.stdout.write(recipe_text(report.to_json(), ".toml"))


@app.command()
@user_errors
@with_settings(StudyChoice, ["storage"])
def migrate(opts: StudyChoice, json_out: Json = False) -> None:
    """Import the studies of a storage stored by an older ilr-search (each is also imported when first opened)."""
    from ilr_search.commands.migrate import migrate_storage

    emit(migrate_storage(opts.storage), json_out, lambda report: ui.out.print(report.text()))
