"""`torchkit train`: image-classification training, one process or many (torchrun).

Its training options are TrainConfig's fields, declared once there (help, panel, flags...): the
command's parameters are generated from those declarations, and its values become a TrainConfig
in one loop. Only the parameters that are not training options are declared here.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import signal
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from torchkit.cli import console
from torchkit.cli.options import FormatOption, OutputOption, StatsOption
from torchkit.cli.render import (
    OutputFormat,
    ReportAtSwap,
    Table,
    emit,
    fixed_format,
    report_file,
    resolve_format,
)
from torchkit.cli.spec_options import declared_parameters, field_value, option_parameters
from torchkit.core.train.config import TRAIN_OPTIONS, TrainConfig
from torchkit.core.train.option_specs import OUTPUTS_PANEL

DEFAULTS = TrainConfig()


def _not_training_options(
    stats: StatsOption = None,
    config_file: Annotated[
        Optional[Path],
        typer.Option(
            "--config",
            rich_help_panel=OUTPUTS_PANEL,
            help="Take the options of a previous run's config.json (or a JSON/YAML file of "
            "option names and values) as defaults; options given here override them. A "
            "config.json's out, resume and force are not carried over; a hand-written file's "
            "`out:` is used as --out, and a `resume:` or `force: true` in it is an error. "
            "- reads it from stdin (train --print-config | ... | train --config -).",
            allow_dash=True,
            metavar="<file>",  # a folder is let through, to be told which file in it to give
        ),
    ] = None,
    print_config: Annotated[
        bool,
        typer.Option(
            "--print-config",
            rich_help_panel=OUTPUTS_PANEL,
            help="Print the effective options as JSON (to -o FILE if given) and exit.",
        ),
    ] = False,
    fmt: FormatOption = None,
    output: OutputOption = None,
) -> None:
    """The parameters of `train` that are not training options (read by `_signature`)."""


def _signature() -> inspect.Signature:
    """`train_command`'s parameters: the training options in TrainConfig's order, with --stats
    opening the general panel and --format and -o before --force, as in every command."""
    training = option_parameters(TrainConfig, TRAIN_OPTIONS)
    others = declared_parameters(_not_training_options)
    ordered = [
        others.pop("stats"),
        *(parameter for name, parameter in training.items() if name != "force"),
        *others.values(),
        training["force"],
    ]
    context = inspect.Parameter(
        "ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context
    )
    return inspect.Signature([context, *ordered], return_annotation=None)


def _refuse_output_meant_as_out(output: Path | None, out: Path | None) -> None:
    """`train -o myrun` meant `--out myrun` (the run folder) far more often than a summary file
    without an extension: say so instead of writing a text file and a run elsewhere."""
    from torchkit.core.io.errors import UsageError
    from torchkit.core.io.shell_words import shell_word
    from torchkit.core.io.special_files import is_special_file

    if output is None or out is not None or output.suffix or is_special_file(output):
        return
    raise UsageError(
        f"-o/--output names the file train's printed summary goes to, and {output} has no "
        "extension",
        f"the run folder is --out: did you mean --out {shell_word(output)}, or -o "
        f"{shell_word(f'{output}.json')} for the summary as JSON?",
    )


def train_command(ctx: typer.Context, **values: Any) -> None:
    """Train an image classifier: checkpoints (last.pt, best.pt), metrics.csv, curves.png,
    config.json and split.csv (path,label,split of every image used) in the run folder, a
    summary at the end (test accuracy of best.pt).

    Examples:

      torchkit train  (convnet on the built-in digits)

      torchkit train --data flowers/ --model resnet18 --weights DEFAULT --epochs 10

      torchkit train --data images/ --val-split 0.2 --amp --ema --mixup-alpha 0.2

      torchkit train --data out/split.csv  (the manifest of `torchkit split --mode manifest`)

      torchkit train --resume runs/convnet-20250101-120000

      torchkit train --config runs/convnet-20250101-120000/config.json --seed 1

      torchrun --nproc_per_node=2 -m torchkit train --data flowers/ --batch-size 32
    """
    from torchkit.cli.app import runs_as_the_program
    from torchkit.cli.progress import TrainProgress
    from torchkit.core.io.claims import tell_note
    from torchkit.core.io.errors import TorchkitError
    from torchkit.core.io.file_outputs import check_output_file
    from torchkit.core.io.overlap import InputPath
    from torchkit.core.runtime.launch import is_main_process
    from torchkit.core.train import run_training
    from torchkit.core.train.stop_signal import StopOnSignal
    from torchkit.core.train.timeline import process_age

    stats, config_file = values.pop("stats"), values.pop("config_file")
    print_config, fmt, output = values.pop("print_config"), values.pop("fmt"), values.pop("output")
    force = values["force"]
    if print_config:
        fmt = fixed_format(fmt, output, OutputFormat.json, "--print-config")
    else:
        fmt = resolve_format(fmt, output)
    output = report_file(output)
    _refuse_output_meant_as_out(output, values["out"])
    is_main = is_main_process()
    if not is_main:  # torchrun: rank 0 reports, the others stay quiet (a recipe's warnings too)
        import logging

        logging.getLogger("torchkit").setLevel(logging.ERROR)
    # The files this command reads besides the data: -o may be none of them.
    option_files = [
        InputPath.of(path, what)
        for path, what in ((stats, "--stats file"), (config_file, "--config file"))
        if path is not None and str(path) != "-"
    ]
    config = _config_from(values, stats)
    given = _given_options(ctx)
    from_file = contextlib.nullcontext()
    recipe_options: Collection[str] = ()
    if config_file is not None:
        config, from_file, recipe_options = _with_config_file(config, config_file, given)
    if print_config:
        from torchkit.core.train.setup import effective_config

        if not is_main:  # torchrun: one copy, rank 0's (the ranks raced to write -o FILE)
            return
        if output is not None:  # `--config r.json --print-config -o r.json` replaced the recipe
            from torchkit.core.train.run_folder import option_inputs

            check_output_file(output, force, option_files + option_inputs(config), what="-o")
        with from_file:
            effective = effective_config(config, given)
        emit(tables=[], data=effective, fmt=OutputFormat.json, output=output, force=force)
        return
    if config.find_lr and is_main:
        from torchkit.core.train.lr_find import ignored_options

        ignored = ignored_options(config)
        if ignored:
            console.note(
                f"--find-lr runs the learning-rate range test only (--find-lr-iters steps, no "
                f"training): {', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} ignored"
            )
    data_named = "data" in given or "data" in recipe_options  # a replayed config.json names it
    if not data_named and config.resume is None and is_main and config.data == DEFAULTS.data:
        console.note(
            "no --data given: training on digits, the 1,797 8x8 handwritten digits "
            "bundled with scikit-learn"
        )
    display = TrainProgress(enabled=is_main)
    # A range test's -o file is written before its files replace an earlier run folder
    # (ReportAtSwap): a report the disk refuses leaves that run as it was. A training run is
    # kept from its first checkpoint on; its summary comes after, as below.
    report = ReportAtSwap(
        functools.partial(_rendered, fmt=fmt, find_lr=True),
        fmt=fmt,
        output=output,
        force=force,
        to_file=None if config.find_lr and is_main else False,
    )
    # -o is checked (with the run folder, against every input) by run_training before any work.
    with report:
        with StopOnSignal(graceful_from_start=not is_main) as stop, display, from_file:
            display.stop = stop
            result = run_training(
                config,
                display,
                overrides=given,
                inputs=option_files,
                output_file=output if is_main else None,
                process_age=process_age() if runs_as_the_program() else None,
                before_keep=report.before_keep,
            )
        if config.find_lr and result.is_main:
            report.after(result)  # stdout, once the progress display is gone
            return
    # Under torchrun a rank may stop because another one was signalled: the run's signal.
    terminated = stop.terminated or (stop.signum is None and result.stop_signal == signal.SIGTERM)
    code = 143 if terminated else 130
    if not result.is_main:
        # Rank 0's exit code (130 or 143, whichever rank was signalled) is the run's, and
        # torchrun reports it. The other ranks end with 0 once rank 0 has their state: a
        # non-zero exit would make torchrun signal rank 0 while it writes last.pt.
        return
    word = "Terminated" if terminated else "Interrupted"
    if result.interrupted and not result.kept:
        console.stderr.print(
            f"{word} before the first checkpoint: nothing kept, {result.out_dir} is as it was",
            highlight=False,
            markup=False,
        )
        raise typer.Exit(code)
    tables, data = _rendered(result, fmt=fmt, find_lr=False)
    try:
        emit(tables=tables, data=data, fmt=fmt, output=output, force=force)
    except TorchkitError as error:  # a full disk: the run is not lost with its summary
        tell_note(_kept_run(result), error)
        if result.interrupted:
            # A stopped run ends with its signal's code however it ends, as every command
            # does: the terminal a SIGHUP closed fails the summary's write (EIO).
            error.exit_code = code
        raise
    if result.interrupted:
        console.stderr.print(
            f"{word}: saved {result.out_dir / 'last.pt'}; continue with "
            f"`{_resume_command(result)}`",
            highlight=False,
            markup=False,
        )
        raise typer.Exit(code)


def _rendered(result: Any, *, fmt: OutputFormat, find_lr: bool) -> tuple[list[Table], dict]:
    """The summary's table and JSON data (--find-lr: the range test's)."""
    from torchkit.cli.train_tables import csv_row_table, lr_find_table, summary_table

    data = result.to_dict()
    if fmt == OutputFormat.csv:  # the JSON's plain values, never the table's display strings
        return [csv_row_table(data)], data
    return [lr_find_table(result) if find_lr else summary_table(result)], data


def _kept_run(result: Any) -> str:
    """What the error line of a summary that could not be written adds: the run is kept."""
    if result.interrupted:
        return (
            f"the run is kept in {result.out_dir} (last.pt saved; continue with "
            f"`{_resume_command(result)}`)"
        )
    return f"the finished run is kept in {result.out_dir}"


def _resume_command(result: Any) -> str:
    """The command that continues a stopped run, as a shell takes it: its folder quoted, and
    --trust-checkpoint where its checkpoint names model code (`package.module:Callable`), which
    --resume refuses to import without it."""
    from torchkit.core.io.shell_words import shell_line
    from torchkit.core.models.usercode import is_callable_spec

    trust = ["--trust-checkpoint"] if is_callable_spec(result.model) else []
    return shell_line(["torchkit", "train", "--resume", result.out_dir, *trust])


def _config_from(values: dict[str, Any], stats: Path | None) -> TrainConfig:
    """The TrainConfig of the command line's values: texts parsed, choices as their names."""
    from torchkit.core.data.preprocessing import mean_std_options

    values = dict(values)
    mean, std = mean_std_options(values.pop("mean"), values.pop("std"), stats)  # --stats: both
    return TrainConfig(
        mean=mean, std=std, **{n: field_value(TRAIN_OPTIONS[n], v) for n, v in values.items()}
    )


def _with_config_file(
    config: TrainConfig, path: Path, given: list[str]
) -> tuple[TrainConfig, contextlib.AbstractContextManager, Collection[str]]:
    """`config` with the recipe's options, the context in which an error about one of
    them names the recipe, and the names of the options the recipe gives."""
    import sys

    from torchkit.core.io.errors import UsageError
    from torchkit.core.train.config_file import (
        apply_config_file,
        naming_the_recipe,
        read_config_file,
        recipe_source,
    )

    if config.resume is not None:
        raise UsageError(
            "--config starts a new run from a recipe; --resume continues a run with its own",
            "drop one of them",
        )
    file_options = read_config_file(path, sys.stdin)
    config = apply_config_file(config, file_options, given, recipe_source(path))
    return config, naming_the_recipe(recipe_source(path), file_options, given), set(file_options)


def _given_options(ctx: typer.Context) -> list[str]:
    """Names of the training options given on the command line (they override a config file's
    and a resumed run's)."""
    given = []
    for name in ctx.params:
        source = ctx.get_parameter_source(name)
        if getattr(source, "name", None) not in ("COMMANDLINE", "ENVIRONMENT"):
            continue
        if name == "stats":  # --stats gives --mean and --std
            given += ["mean", "std"]
        elif name in TRAIN_OPTIONS:
            given.append(name)
    return given


train_command.__signature__ = _signature()  # type: ignore[attr-defined]


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)
