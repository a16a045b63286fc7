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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ilr_search.cli import ui
from ilr_search.errors import UserInputError
from ilr_search.interrupts import recorded

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
# Options shared by flops, train and run: declared once, added to each command's signature. flops takes the
# model's (its shape and vocabulary: what its FLOPs depend on), train and run the training's too.


@dataclass
class SpaceOptions:
    space: Path | None = None
    layers: int | None = None
    d_model: int | None = None
    heads: int | None = None
    seq_len: int | None = None
    mlp_ratio: float | None = None
    pe: str | None = None
    tokenizer: str | None = None
    data: str | None = None  # the training options: None in flops, which has none of them
    text_column: str | None = None
    answer_column: str | None = None
    choices_column: str | None = None
    tasks_path: str | None = None
    steps: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    seed: int | None = None
    device: str | None = None
    dtype: str | None = None
    compile: bool | None = None

    def given(self) -> tuple[str, ...]:
        """The names of the options given, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None)

    def overrides(self) -> dict[str, dict[str, Any]]:
        return {
            "model": {
                "layers": self.layers,
                "d_model": self.d_model,
                "heads": self.heads,
                "seq_len": self.seq_len,
                "mlp_ratio": self.mlp_ratio,
                "pe": self.pe,
            },
            "data": {
                "corpus": self.data,
                "tokenizer": self.tokenizer,
                "text_column": self.text_column,
                "answer_column": self.answer_column,
                "choices_column": self.choices_column,
                "tasks_path": self.tasks_path,
            },
            "train": {
                "steps": self.steps,
                "batch_size": self.batch_size,
                "lr": self.lr,
                "seed": self.seed,
                "device": self.device,
                "dtype": self.dtype,
                "compile": self.compile,
            },
        }


def _model_option_signature(
    space: Annotated[
        Path | None,
        typer.Option(
            help=(
                "Search-space TOML, or a preset by name (default, paper-small, paper-large, bench-small, "
                "bench-crossing). \\[default: default]"
            )
        ),
    ] = None,
    layers: Annotated[int | None, typer.Option(help="Number of distinct layers L. \\[default: from the space]")] = None,
    d_model: Annotated[int | None, typer.Option(help="Model width.")] = None,
    heads: Annotated[int | None, typer.Option(help="Attention heads.")] = None,
    seq_len: Annotated[int | None, typer.Option(help="Context length of the proxy.")] = None,
    mlp_ratio: Annotated[float | None, typer.Option(help="SwiGLU width as a multiple of d_model.")] = None,
    pe: Annotated[str | None, typer.Option(help="Positional encoding: nope|rope|learned|alibi.")] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(help="byte, bpe:N, hf:NAME or file:PATH (a tokenizer.json); sets the model's vocabulary."),
    ] = None,
) -> None: ...


def _training_option_signature(
    data: Annotated[
        str | None, typer.Option(help="stdlib (embedded), a local file/folder, or hf:NAME[:CONFIG].")
    ] = None,
    text_column: Annotated[
        str | None,
        typer.Option(help="Text column of .jsonl/.parquet/.csv data (with --answer-column: the prompt column)."),
    ] = None,
    answer_column: Annotated[
        str | None,
        typer.Option(
            help=(
                "Answer column of prompt/answer rows: the loss and validation metrics are on the answer tokens only. "
                "\\[default: none, the whole text]"
            )
        ),
    ] = None,
    choices_column: Annotated[
        str | None,
        typer.Option(
            help=(
                "--objective choice: the column of each item's choices (a list; in CSV a JSON list), the correct one "
                "in --answer-column as its index or its text."
            )
        ),
    ] = None,
    tasks_path: Annotated[
        str | None,
        typer.Option(help="--objective lm-eval:TASK: a folder of local lm-eval task YAMLs (their data_files local)."),
    ] = None,
    steps: Annotated[int | None, typer.Option(help="Proxy training steps.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Sequences per step.")] = None,
    lr: Annotated[float | None, typer.Option(help="Peak learning rate.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of data order and initialisation.")] = None,
    device: Annotated[str | None, typer.Option(help="auto|cpu|cuda|mps.")] = None,
    dtype: Annotated[
        str | None,
        typer.Option(
            help=(
                "auto|fp32|bf16: training in bf16 autocasts; a frozen evaluation stores its weights in bf16 (auto: "
                "where the device computes bf16 natively)."
            )
        ),
    ] = None,
    compile: Annotated[
        bool | None, typer.Option("--compile/--no-compile", help="Compile each decoder layer. \\[default: auto]")
    ] = None,
) -> None: ...


_MODEL_OPTIONS = inspect.signature(_model_option_signature).parameters
_SHARED = {**_MODEL_OPTIONS, **inspect.signature(_training_option_signature).parameters}  # train's and run's


def _with_options(options: Mapping[str, inspect.Parameter]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator giving `command` the `options`; it receives them together as `opts: SpaceOptions` (the
    options it lacks None)."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for name, p in inspect.signature(command).parameters.items() if name != "opts"]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            shared = {name: kwargs.pop(name) for name in options}
            return command(opts=SpaceOptions(**shared), **kwargs)

        # inspect.signature (and so typer) reads __signature__, which typeshed does not declare on a function
        wrapper.__signature__ = inspect.Signature(own + list(options.values()))  # type: ignore[attr-defined]
        return wrapper

    return decorate


with_space_options = _with_options(_SHARED)  # the model's and the training's options
with_model_options = _with_options(_MODEL_OPTIONS)  # the model's only


def _judge_option_signature(
    space: Annotated[
        Path | None,
        typer.Option(help="Search-space TOML or preset whose \\[data] and \\[train] settings the judge reads."),
    ] = None,
    seq_len: Annotated[int | None, typer.Option(help="Tokens a held-out window (and an item at most) holds.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Windows or items evaluated at once.")] = None,
    seed: Annotated[
        int | None, typer.Option(help=r"The first chunk evaluated (chunk 0 orders the candidates). \[default: 0]")
    ] = None,
    device: Annotated[str | None, typer.Option(help="auto|cpu|cuda|mps.")] = None,
    dtype: Annotated[
        str | None,
        typer.Option(help="auto|fp32|bf16: the weights' dtype (auto: bf16 where the device computes it natively)."),
    ] = None,
) -> None: ...


# judge's options: what it evaluates and how (no shape flag: the checkpoint sets the model; no training flag)
_JUDGE = {
    **inspect.signature(_judge_option_signature).parameters,
    **{
        name: p
        for name, p in inspect.signature(_training_option_signature).parameters.items()
        if name in ("data", "text_column", "answer_column", "choices_column", "tasks_path")
    },
}
with_judge_options = _with_options(_JUDGE)


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


ReuseMap = Annotated[
    str | None,
    typer.Option(
        help=(
            "One positive count per layer, e.g. 4,2,1,1, or a block map block:I-J:R (layers I..J, from 0, run R times "
            "as a block)."
        )
    ),
]
Block = Annotated[int | None, typer.Option(help="Block recurrence: the whole stack run K times.")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]
Init = Annotated[
    str | None,
    typer.Option(
        help=(
            "Start from a pretrained checkpoint: a folder as transformers' save_pretrained writes it (config.json, "
            "safetensors, tokenizer.json), a GGUF file (or a folder holding one; converted once, dequantized to "
            "float32) or hf:NAME. The model takes its architecture and weights, the data its "
            "tokenizer; the shape flags and --tokenizer go without it."
        )
    ),
]
KnobSettings = Annotated[
    str | None,
    typer.Option(
        help=(
            "Recurrence knobs on: injection[=add|gated], iteration_encoding, iteration_norms, depth_init (init for the "
            "schedule's depth), repeat_scale[=residual|lr], damping=A, adapters=RANK, capacity=C (the fraction of "
            "tokens each repeated pass runs, in (0, 1]); comma-separated."
        )
    ),
]


def map_option(help: str) -> Any:
    """The option --map (its parameter is map_: map is a builtin), with the command's own help."""
    return typer.Option("--map", help=help)


# ----------------------------------------------------------------------------------------------------


@app.command()
@user_errors
@with_model_options
def flops(
    opts: SpaceOptions,
    reuse_map: ReuseMap = None,
    block: Block = None,
    knobs: KnobSettings = None,
    init: Init = None,
    json_out: Json = False,
) -> None:
    """Analytic forward FLOPs per token of a reuse map, and its ratio to the all-ones map.

    train_flops counts the space's proxy training (its steps and batch size)."""
    from ilr_search.commands.api import flops_report

    check_init(opts, init)
    emit(flops_report(opts.space, opts.overrides(), reuse_map, block, knobs, init), json_out, ui.print_flops)


def check_init(opts: SpaceOptions, init: str | None) -> None:
    """The options --init refuses (commands.api.check_init_flags), then its note held."""
    from ilr_search.commands.api import check_init_flags

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
@with_space_options
def train(
    opts: SpaceOptions,
    reuse_map: ReuseMap = None,
    block: Block = None,
    knobs: KnobSettings = None,
    from_study: Annotated[
        str | None,
        typer.Option(
            "--from-study",
            help=(
                "Train with this study's stored model, data and training settings (--steps, --seed, --device, --dtype "
                "and --compile may change them)."
            ),
        ),
    ] = None,
    storage: Annotated[
        str | None, typer.Option(help="Storage of --from-study. \\[default: sqlite:///studies/ilr-search.db]")
    ] = None,
    map_: Annotated[
        str | None,
        map_option(
            "With --from-study: the map, as the study names it (2,1,1,1, 2,1,1,1|injection=add, block:1-2:2 or "
            "block2). \\[default: the front's map of lowest perplexity]"
        ),
    ] = None,
    save: Annotated[Path | None, typer.Option(help="Write the trained model to this folder, in --format.")] = None,
    save_format: Annotated[
        str,
        typer.Option(
            "--format",
            help=(
                "With --save: native (model.safetensors, config.json and the tokenizer; ILRTransformer.load "
                "reads them, export-model --model re-exports them) or hf (a standard transformers checkpoint of "
                "the imported family, else llama, its schedule unrolled, with the tokenizer)."
            ),
        ),
    ] = "native",
    init: Init = None,
    json_out: Json = False,
) -> None:
    """Train one proxy model for a reuse map (or --block K) and report its validation perplexity."""
    from ilr_search.commands.api import TrainOptions, train_command

    options = TrainOptions(
        opts.space,
        opts.overrides(),
        opts.given(),
        reuse_map,
        block,
        knobs,
        from_study,
        storage,
        map_,
        save,
        save_format,
        init,
    )
    options.check()
    hold_init_note(init)
    with ui.step_progress(enabled=True) as on_step:
        report = train_command(options, on_step, lambda why: ui.hold_note(f"study {from_study}: {why}"))
    emit(report, json_out, ui.print_train)
    if save is not None and not json_out:
        ui.out.print(f"saved the model to {save}")


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


Storage = Annotated[
    str | None,
    typer.Option(
        help="Optuna storage URL (sqlite, postgresql, mysql) or journal:PATH. \\[default: sqlite:///studies/ilr-search.db]"
    ),
]
StudyName = Annotated[
    str | None,
    typer.Option("--study", help="Study name; the same name resumes. \\[default: derived from the configuration]"),
]


@app.command()
@user_errors
@with_space_options
def run(
    opts: SpaceOptions,
    budget: Annotated[
        str, typer.Option(help="Forward compute per token: 1.5x or 150% of the all-ones map, or FLOPs like 4.2e6.")
    ],
    study: StudyName = None,
    storage: Storage = None,
    n_trials: Annotated[
        int | None, typer.Option(help="Finished trials the study should reach in total. \\[default: from the space]")
    ] = None,
    timeout: Annotated[float | None, typer.Option(help="Stop starting new trials after this many seconds.")] = None,
    time_budget: Annotated[
        str | None,
        typer.Option(
            help=(
                "A wall-clock budget for this invocation of the whole study (trials, reference runs, race): 15m, "
                "90s, 1h, 1.5h or seconds. No new run starts once it is spent (runs in flight finish); the run ends "
                "undecided with exit 0 and the same command continues. Never stored with the study. \\[default: "
                "the space's time_budget, else none]"
            )
        ),
    ] = None,
    sampler: Annotated[str | None, typer.Option(help="auto|tpe|nsga2|gp|random|grid. \\[default: auto]")] = None,
    pruner: Annotated[
        str | None,
        typer.Option(
            help=(
                "pareto (calibrated: prunes only at rungs that predict the final ranking) | pareto-eager (the "
                "uncalibrated rule) | median | none. \\[default: pareto]"
            )
        ),
    ] = None,
    objective: Annotated[
        str | None,
        typer.Option(
            help=(
                "pareto (perplexity and FLOPs), ppl (budget as a constraint only), answer (the answer tokens' "
                "perplexity and FLOPs; needs --answer-column), or task items scored frozen (--init, --train-steps 0), "
                "each right or wrong: choice (the correct choice's summed log-likelihood the highest, lm-eval's acc; "
                "--choices-column), exact (greedy decoding to a newline matches the answer after normalising case and "
                "spaces), lm-eval:TASK (an lm-evaluation-harness task's 0/1 metric per document; extra .[eval])."
            )
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            help=(
                "Worker processes on this machine, sharing the study and the device (its trials, reference runs and "
                "race); on a CPU one thread each. \\[default: from the space: one a CPU core in default.toml, else 1, "
                "or as --fuse auto chooses]"
            )
        ),
    ] = None,
    fuse: Annotated[
        str | None,
        typer.Option(
            help=(
                "Maps trained at once in one fused group (K proxies in lockstep in one process); 1: one at a time; "
                "auto: K (and on a CPU, workers against threads) from memory and a short probe. A resume reuses the "
                "study's stored layout unless --fuse or --workers is given. \\[default: from the space, 4 in "
                "default.toml]"
            )
        ),
    ] = None,
    knobs: Annotated[
        str | None,
        typer.Option(
            help=(
                "Recurrence knobs searched with the map, comma-separated: injection, iteration_encoding, "
                "iteration_norms, depth_init, repeat_scale, damping, adapters, capacity. \\[default: from the space, "
                "none in the presets]"
            )
        ),
    ] = None,
    parts: Annotated[
        str | None,
        typer.Option(
            help=(
                "Which part of a repeated layer or block the search proposes, comma-separated: both (the whole layer, "
                "R), attn (its attention repeated, Ra), mlp (its MLP repeated, Rm). \\[default: from the space, both "
                "in default.toml]"
            )
        ),
    ] = None,
    track: Annotated[
        str | None,
        typer.Option(
            help=(
                "Log each trial (validation curve, map, knobs, final values) and the reference runs: tensorboard:DIR "
                "or mlflow:URI (needs mlflow)."
            )
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help=(
                "Print the plan (study, trials, references, pruning rungs, storage, space) and a time estimate from a "
                "short timed probe; write nothing."
            ),
        ),
    ] = False,
    target: Annotated[
        str | None,
        typer.Option(
            help=(
                "The length the verdict is about, a multiple of the proxy's steps: contenders are screened and raced "
                "there (1x: seeds only). \\[default: from the space, 4x]"
            )
        ),
    ] = None,
    race_seeds: Annotated[
        int | None,
        typer.Option(
            help=(
                "Seeds each contender has at the target at its first test (adaptive race: the first screens, the rest "
                "test; fixed race: seeds at every length). --target 1x --race-seeds 1: no race. \\[default: from the "
                "space, 3]"
            )
        ),
    ] = None,
    max_seeds: Annotated[
        int | None,
        typer.Option(
            help=(
                "Adaptive race: the most seeds a contender gets at the target; seeds are added while its comparison "
                "with the baseline is open. \\[default: from the space, 8]"
            )
        ),
    ] = None,
    max_race_steps: Annotated[
        int | None,
        typer.Option(
            help=(
                "A cap on the steps the race trains (0: none); a resume with a larger cap goes on. \\[default: from "
                "the space, 0]"
            )
        ),
    ] = None,
    race_policy: Annotated[
        str | None,
        typer.Option(
            help=(
                "adaptive (judged at the target, seeds until decided) or fixed (race-seeds at doubled lengths, as "
                "studies made before it). \\[default: from the space, adaptive]"
            )
        ),
    ] = None,
    equal_compute: Annotated[
        str | None,
        typer.Option(
            help=(
                "depth: also race a plain model as deep as the best contender runs (the same compute, more "
                "parameters); off. \\[default: from the space, depth]"
            )
        ),
    ] = None,
    enqueue: Annotated[
        str | None,
        typer.Option(
            help=(
                'Your maps, trained first after the baseline, in order, space-separated: "3,2,2,1 4,2,1,1", with knobs '
                "as --knobs of train takes them (2,1,1,1|injection=add), block maps block:I-J:R (where the study "
                "searches blocks), blockK (trained as a reference run; a trial where blocks are searched), or a "
                "mergekit passthrough config FILE.yml of the checkpoint (the map its slices stack, a scale on "
                "o_proj/down_proj read as damping). Over-budget maps are repaired to the budget. \\[default: the "
                "space's enqueue list]"
            )
        ),
    ] = None,
    init: Init = None,
    train_steps: Annotated[
        int | None,
        typer.Option(
            help=(
                "Steps each map trains (--steps under the name a pretrained model's search uses): with --init, 0 "
                "evaluates each map on the checkpoint's weights as they are (frozen, the race pairs maps by held-out "
                "window chunk), N continues training them (retrofit). \\[default: from the space]"
            )
        ),
    ] = None,
    learn: Annotated[
        bool,
        typer.Option(
            "--learn",
            help=(
                "Also learn a map: one model trained at the widest schedule (every layer max_reuse times) with a gate "
                "on each extra pass, held within the budget; the passes whose gate ends >= 0.5 are the map, trained "
                "and raced as a trial. With --n-trials 0: the learned map and the plain model alone. Frozen (--init "
                "--train-steps 0): only the gates learn, on the select windows."
            ),
        ),
    ] = False,
    json_out: Json = False,
) -> None:
    """Search reuse maps under a FLOP budget; running it again resumes the study."""
    from ilr_search.commands.run import RunOptions, run_request

    check_init(opts, init)
    request = run_request(
        RunOptions(
            opts.space,
            opts.overrides(),
            budget,
            study,
            storage,
            n_trials,
            timeout,
            sampler,
            pruner,
            objective,
            workers,
            fuse,
            knobs,
            target,
            race_seeds,
            max_seeds,
            max_race_steps,
            race_policy,
            equal_compute,
            enqueue,
            train_steps=train_steps,
            init=init,
            parts=parts,
            time_budget=time_budget,
            learn=learn,
        )
    )
    tracked_reporter(track, storage, open_uri=False)  # a bad --track is refused before the probe
    if dry_run:
        from ilr_search.commands.dryrun import dry_run_report

        emit(dry_run_report(request), json_out, ui.print_plan)
        return
    tracked = tracked_reporter(track, storage)
    run_and_show(request, lambda: tracked(ui.ConsoleReporter(enabled=True)), json_out, ui.print_run)


@app.command()
@user_errors
@with_judge_options
def judge(
    opts: SpaceOptions,
    init: Annotated[
        str,
        typer.Option(
            help=(
                "The model judged: a folder as save_pretrained writes it, a GGUF file (or a folder holding one) or "
                "hf:NAME; evaluated frozen, as it is."
            )
        ),
    ],
    candidate: Annotated[
        list[str],
        typer.Option(
            help=(
                "A candidate, repeatable: a reuse map (2,1,1,1), a block map (block:16-27:2), either with "
                "|damping=A, or a mergekit passthrough YAML that stacks slices of the one model (a scale on "
                "o_proj/down_proj read as damping)."
            )
        ),
    ],
    objective: Annotated[
        str | None,
        typer.Option(
            help=(
                "What is judged: pareto (held-out text's loss, the default), answer (--answer-column), choice, exact "
                "or lm-eval:TASK (task items, each right or wrong). As run --objective."
            )
        ),
    ] = None,
    budget: Annotated[
        str | None,
        typer.Option(
            help=r"A FLOPs budget the candidates must fit (1.5x), else refused. \[default: the costliest candidate's]"
        ),
    ] = None,
    chunks: Annotated[
        int | None,
        typer.Option(
            help=(
                "Chunks evaluated at most: chunk 0 orders the candidates, the rest test them, until each comparison "
                r"is decided. \[default: 16, or as many as the data holds]"
            )
        ),
    ] = None,
    chunk_size: Annotated[
        int | None,
        typer.Option(
            help=(
                r"Windows or items a chunk. \[default: the space's eval_windows, fewer where the items would "
                "otherwise make fewer than --chunks chunks]"
            )
        ),
    ] = None,
    study: StudyName = None,
    storage: Storage = None,
    json_out: Json = False,
) -> None:
    """Is a candidate (a map, a block, a mergekit config) better than the model it was made from? No search: raced
    against the model on held-out windows or items, paired, until decided; the same command resumes."""
    from ilr_search.commands.judge import JudgeOptions, judge_request

    check_init(opts, init)
    request, candidates = judge_request(
        JudgeOptions(
            init, tuple(candidate), opts.space, opts.overrides(), objective, budget, study, storage, chunks, chunk_size
        )
    )
    baseline = ",".join("1" * request.space.model.n_layers)
    for c in candidates:
        ui.hold_note(c.line(baseline))
    run_and_show(request, lambda: ui.ConsoleReporter(enabled=True), json_out, ui.print_judge)


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


ReadStudy = Annotated[
    str | None,
    typer.Option("--study", help="Study name. \\[default: the storage's only study, else its most recently active]"),
]


def study_or_default(study: str | None, storage: str | None) -> str:
    if study:
        return study
    from ilr_search.commands.studies import default_study

    name, why = default_study(storage)
    ui.hold_note(f"study {name} ({why})")
    return name


@app.command()
@user_errors
def studies(storage: Storage = None, json_out: Json = False) -> None:
    """List the studies in a storage."""
    from ilr_search.commands.studies import list_studies

    emit(list_studies(storage), json_out, ui.print_studies)


@app.command()
@user_errors
def trials(study: ReadStudy = None, storage: Storage = None, json_out: Json = False) -> None:
    """List the trials of a study, and how far its proxy can be trusted."""
    from ilr_search.commands.studies import trials_report

    emit(trials_report(study_or_default(study, storage), storage), json_out, ui.print_trials)


@app.command()
@user_errors
def pareto(
    study: ReadStudy = None,
    storage: Storage = None,
    out: Annotated[
        Path | None, typer.Option(help="Write .html (interactive, offline), .png/.svg (kaleido), .csv or .json.")
    ] = None,
    view: Annotated[
        str,
        typer.Option(
            help="front; layers: which layers the front's maps recur and their importance; or blocks: a block "
            "search's (start, end) grid of loss differences to the plain model, one grid per repeat count."
        ),
    ] = "front",
    json_out: Json = False,
) -> None:
    """The Pareto front of perplexity vs compute: a table, and a figure or table file with --out."""
    from ilr_search.commands.report import pareto_blocks, pareto_report

    if view not in ("front", "layers", "blocks"):
        fail(f"unknown --view {view!r}; use front, layers or blocks")
    if view == "blocks":
        emit(pareto_blocks(study_or_default(study, storage), storage, out), json_out, ui.print_blocks)
        return
    emit(pareto_report(study_or_default(study, storage), storage, out, view), json_out, ui.print_pareto)


@app.command()
@user_errors
def export(
    out: Annotated[Path, typer.Option(help="trials.csv or trials.parquet")],
    study: ReadStudy = None,
    storage: Storage = None,
    curves: Annotated[
        Path | None,
        typer.Option(
            help=(
                "Also write the learning curves as a long table (trial, reference, map, kind val|train, step, tokens, "
                "loss; a race run's seed, run_steps): curves.csv or curves.parquet."
            )
        ),
    ] = None,
    json_out: Json = False,
) -> None:
    """Write one row per trial (map, state, objectives, parameters, steps, pruning, durations), per reference run and per race run."""  # noqa: E501 -- typer lists the command by this paragraph, its line breaks kept
    from ilr_search.commands.report import export_trials

    emit(export_trials(study_or_default(study, storage), storage, out, curves), json_out, ui.print_export)


@app.command()
@user_errors
def audit(
    study: ReadStudy = None,
    storage: Storage = None,
    factor: Annotated[float, typer.Option(help="Retrain at this many times the proxy's steps (at least 1).")] = 4.0,
    maps: Annotated[
        str,
        typer.Option(
            help="auto (front, baseline, best pruned near the front, random trained maps), front, top:K or all."
        ),
    ] = "auto",
    seeds: Annotated[int, typer.Option(help="Seeds per map (the study's seed first).")] = 1,
    fuse: Annotated[
        str,
        typer.Option(help="Runs of one model trained at once in one fused group (the same results); 1: one at a time."),
    ] = "1",
    json_out: Json = False,
) -> None:
    """Retrain chosen maps of a study FACTOR times longer and say how far the proxy's ranking holds (resumable)."""
    from ilr_search.commands.audit import run_audit
    from ilr_search.commands.autofuse import parse_fuse
    from ilr_search.config import AuditSettings

    k = parse_fuse(fuse)
    if k == "auto":
        raise UserInputError("audit --fuse takes a number of runs (auto is run's); e.g. --fuse 4")
    with ui.ConsoleReporter(enabled=True) as reporter:
        report = run_audit(
            study_or_default(study, storage), storage, AuditSettings(factor, maps, seeds), reporter, fuse=int(k)
        )
    emit(report, json_out, ui.print_audit)


bench_app = typer.Typer(no_args_is_help=True, help="The tabular benchmark: every feasible map of a small space.")
app.add_typer(bench_app, name="bench")


@bench_app.command("build")
@user_errors
def bench_build(
    space: Annotated[Path, typer.Option(help="A small search space, e.g. search_spaces/bench-small.toml.")],
    out: Annotated[Path, typer.Option(help="The table: bench.parquet (or .csv).")],
    budget: Annotated[str, typer.Option(help="FLOP budget the maps must fit.")] = "2x",
    storage: Storage = None,
    study: StudyName = None,
    steps: Annotated[
        int | None, typer.Option(help="Proxy steps (a longer table of the same space). \\[default: the space's]")
    ] = None,
    sample: Annotated[
        int | None,
        typer.Option(
            help="Train only this many maps (a seeded sample; the baseline always). \\[default: every feasible map]"
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the sample.")] = 0,
    json_out: Json = False,
) -> None:
    """Train every feasible map of a small space and write the table (resumable: it is a study)."""
    from ilr_search.commands.bench import build_table

    with ui.ConsoleReporter(enabled=True) as reporter:
        report = build_table(space, out, budget, storage, study, reporter, steps, sample, seed)
    emit(report, json_out, lambda r: ui.out.print(f"wrote {r.maps} maps to {r.out} (study {r.study})"))


@bench_app.command("replay")
@user_errors
def bench_replay(
    table: Annotated[
        Path,
        typer.Option(
            help=(
                "A table in the bench format (bench build writes one; partial tables and blockK rows are fine), or "
                "with --policy a truth table (benchmarks/truth.py)."
            )
        ),
    ],
    pruner: Annotated[
        str, typer.Option(help="pareto (calibrated, the default) or pareto-eager (the uncalibrated rule), or none.")
    ] = "pareto",
    seed: Annotated[
        int | None,
        typer.Option(
            help="Shuffle the row order with this seed (with --policy: the first order). \\[default: table order]"
        ),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            help=(
                "Replay a whole policy over a truth table instead: race (seeds and lengths, paired tests), today (one "
                "seed at the base length, pruned) or none (one seed, no pruning)."
            )
        ),
    ] = None,
    orders: Annotated[
        int,
        typer.Option(
            help=(
                "With --policy: replays, each in its own order (seed order for race, row order and seed for "
                "today/none)."
            )
        ),
    ] = 10,
    race_seeds: Annotated[
        int | None,
        typer.Option(
            help="With --policy race: seeds the race uses, drawn from the table's. \\[default: all the table's]"
        ),
    ] = None,
    confidence: Annotated[
        float, typer.Option(help="With --policy race: confidence of the paired tests and intervals.")
    ] = 0.9,
    max_contenders: Annotated[
        int | None,
        typer.Option(
            help=(
                "With --policy race or race-fixed: maps raced beyond their first result, the baseline among them. "
                "\\[default: 3 for race (a default study), 6 for race-fixed]"
            )
        ),
    ] = None,
    json_out: Json = False,
) -> None:
    """Replay a pruning rule over a table's rows: the maps it prunes, the steps it saves, the front maps it loses
    (with --policy: a policy over a truth table: compute, claims against the table's seed means, regret, coverage)."""
    if policy is not None:
        from ilr_search.commands.bench import replay_policy

        report = replay_policy(table, policy, orders, seed or 0, race_seeds, confidence, max_contenders)
        emit(report, json_out, ui.print_policy_replay)
        return
    from ilr_search.commands.bench import replay_table

    emit(replay_table(table, pruner, seed), json_out, ui.print_pruning_replay)


@bench_app.command("power")
@user_errors
def bench_power(
    table: Annotated[
        Path, typer.Option(help="A truth table (benchmarks/truth.py builds them): maps at several lengths and seeds.")
    ],
    deltas: Annotated[
        str,
        typer.Option(
            help=(
                "Planted gaps in the table's seed sd at the target, comma-separated (0: the A/A table, every map at "
                "the baseline's mean)."
            )
        ),
    ] = "0,0.5,1,2,3,4",
    crossing: Annotated[
        str,
        typer.Option(
            help=(
                "Crossing gaps in seed sd (worse by the gap at the base length, better at the target), "
                "comma-separated; empty: none."
            )
        ),
    ] = "2",
    orders: Annotated[int, typer.Option(help="Seed orders replayed per planted map.")] = 10,
    maps: Annotated[
        str | None,
        typer.Option(help="The maps planted, space-separated. \\[default: every recurrent map of the table]"),
    ] = None,
    policy: Annotated[
        str,
        typer.Option(
            help="race (the adaptive race of a default study), race-fixed (the fixed race at --fixed-seeds), or both."
        ),
    ] = "both",
    fixed_seeds: Annotated[int, typer.Option(help="Seeds of the fixed race, drawn from the table's.")] = 3,
    against: Annotated[
        str,
        typer.Option(
            help=(
                "baseline: the planted map beats the baseline by the gap; best: it beats the table's best map at the "
                "target by the gap (for tables where recurrence already wins)."
            )
        ),
    ] = "baseline",
    json_out: Json = False,
) -> None:
    """The race's power, measured on itself: plant a gap in one map of a truth table, replay the race over many
    orders, count how often it claims that map (and any other), at every gap."""
    from ilr_search.commands.bench.power import power_command

    emit(power_command(table, deltas, crossing, orders, maps, policy, fixed_seeds, against), json_out, ui.print_power)


@app.command("export-model")
@user_errors
def export_model(
    out: Annotated[
        Path,
        typer.Option(
            help=(
                "A new or empty folder for the checkpoint (config.json, model.safetensors, tokenizer files); with "
                "--format mergekit a new FILE.yml."
            )
        ),
    ],
    study: Annotated[
        str | None,
        typer.Option(
            "--study",
            help=(
                "A frozen study of a pretrained model (run --init ... --train-steps 0): its checkpoint's weights under "
                "--map."
            ),
        ),
    ] = None,
    storage: Annotated[
        str | None, typer.Option(help="Storage of --study. \\[default: sqlite:///studies/ilr-search.db]")
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(help="Instead of --study: a folder train --save wrote (native), exported under --map."),
    ] = None,
    map_: Annotated[
        str | None,
        map_option(
            "The map the checkpoint unrolls: 2,2,1,1, block:1-2:2 or block2 (with --study also damping, e.g. "
            "block:1-2:2|damping=0.5); 1,1,1,1 writes each distinct layer once. \\[default: the study's decided "
            "best map, as recipe chooses it; for --model the map it was trained with]"
        ),
    ] = None,
    family: Annotated[
        str | None,
        typer.Option(help="llama, mistral, qwen2 or qwen3. \\[default: the imported checkpoint's family, else llama]"),
    ] = None,
    export_format: Annotated[
        str,
        typer.Option(
            "--format",
            help=(
                "hf (a standard transformers checkpoint) or mergekit (with --study: the passthrough config that "
                "builds it from the study's checkpoint with mergekit-yaml, damping as o_proj/down_proj scales)."
            ),
        ),
    ] = "hf",
    json_out: Json = False,
) -> None:
    """Write a standard transformers checkpoint of a model under a map, its repeated layers unrolled, with its tokenizer (or a mergekit config that builds it)."""  # noqa: E501 -- typer lists the command by this paragraph, its line breaks kept
    from ilr_search.commands.export import export_checkpoint

    report = export_checkpoint(
        out, study, storage, model, map_, family, export_format, lambda why: ui.hold_note(f"study {study}: {why}")
    )
    emit(report, json_out, ui.print_export_model)


@app.command()
@user_errors
def recipe(
    study: ReadStudy = None,
    storage: Storage = None,
    map_: Annotated[
        str | None,
        map_option(
            "A map the study trained (2,1,1,1, 2,1,1,1|injection=add, block:1-2:2 or block2). \\[default: the "
            "front's map of lowest perplexity]"
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Write the recipe to FILE.toml or FILE.json. \\[default: TOML on stdout]")
    ] = None,
    json_out: Json = False,
) -> None:
    """Everything needed to train one map of a study elsewhere: model config, map, schedule, knobs, training and data settings, measured perplexities."""  # noqa: E501 -- typer lists the command by this paragraph, its line breaks kept
    from ilr_search.commands.recipe import RECIPE_FORMATS, recipe_text, study_recipe, write_recipe
    from ilr_search.commands.report import check_out_path

    path = check_out_path(out, RECIPE_FORMATS) if out is not None else None
    name = study_or_default(study, storage)
    report = study_recipe(name, storage, map_, on_choice=lambda why: ui.hold_note(f"study {name}: {why}"))
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
def migrate(storage: Storage = None, json_out: Json = False) -> None:
    """Import the studies of a storage stored by an older ilr-search (each is also imported when first opened)."""
    from ilr_search.commands.migrate import migrate_storage

    emit(migrate_storage(storage), json_out, lambda report: ui.out.print(report.text()))
