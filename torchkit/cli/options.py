"""Options shared by several commands, so each is spelled and documented once."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from torchkit.cli.render import FORMAT_RULE, MOST_CLASS_ROWS, OutputFormat


def _complete_device(incomplete: str) -> list[str]:
    return [
        d for d in ("auto", "cpu", "cuda", "cuda:0", "cuda:1", "mps") if d.startswith(incomplete)
    ]


# None when not given: the format is then the one -o's name says (render.resolve_format).
FormatOption = Annotated[
    Optional[OutputFormat],
    typer.Option(
        "--format", help=f"Output format. {FORMAT_RULE}", case_sensitive=False, show_default=False
    ),
]
OutputOption = Annotated[
    Optional[Path],
    typer.Option(
        "--output",
        "-o",
        help="Write the result to FILE instead of stdout (FILE.csv or FILE.json: in that format).",
        dir_okay=False,
    ),
]
ForceOption = Annotated[bool, typer.Option("--force", help="Overwrite existing outputs.")]

# split's and dataset-stats' (eval words its own: it picks other classes).
AllClassesOption = Annotated[
    bool,
    typer.Option(
        "--all-classes",
        help=f"Show every class in the table (by default, above {MOST_CLASS_ROWS} classes, the "
        f"{MOST_CLASS_ROWS // 2} largest and the {MOST_CLASS_ROWS // 2} smallest); --format csv "
        "or json always list every class.",
    ),
]
# The one rule for output locations (README, "Conventions"): `--out` names what a command makes
# (a file or folder; a positional OUT is the same thing), `-o/--output` only the printed report.
OutOption = Annotated[
    Optional[Path],
    typer.Option(
        "--out",
        help="What the command writes (the same as the positional OUT; give one of them).",
        show_default=False,
    ),
]
# `--out` of a command whose product is one file (export, convert checkpoint, convert-syncbn):
# no folder, so that `--out exports/` is refused while it still ends in its slash (cli.app).
FileOutOption = Annotated[
    Optional[Path],
    typer.Option(
        "--out",
        help="The file the command writes (the same as the positional OUT; give one of them).",
        show_default=False,
        dir_okay=False,
    ),
]


def model_and_rest(positional: Any, option: Any, rest: list[Any]) -> tuple[Any, list[Any]]:
    """MODEL given first or as --model: with --model, what the shell put in MODEL's place is the
    first of the arguments that follow (`predict --model ck.pt photos/`)."""
    from torchkit.core.io.errors import UsageError

    if option is None:
        if positional is None:
            raise UsageError("missing MODEL", "give it first, or as --model MODEL")
        return positional, rest
    return option, ([positional] if positional is not None else []) + list(rest)


def former_short_flag(value: Any, former: Any, *, option: str, flag: str) -> Any:
    """An option given by its long name, or by the short flag it had before that flag was given
    its meaning of the other commands (kept, hidden, so that old scripts run); both: an error."""
    from torchkit.core.io.errors import UsageError

    if former is None:
        return value
    if value is not None:
        raise UsageError(f"{option} is given twice (also as {flag})", f"give {option} once")
    return former


def product_path(
    positional: Any,
    option: Any,
    *,
    required: bool = True,
    name: str = "OUT",
    data: Any = None,
    data_name: str = "ROOT",
):
    """OUT given positionally or as --out (the same thing); both naming two places, or neither
    when one is required, is a usage error. `data`: the --data that made the positional OUT
    (data_and_rest), named in the error, as the positional may have been meant as the data."""
    from torchkit.cli.out_beside_data import argument_rule
    from torchkit.core.io.errors import UsageError

    if positional is not None and option is not None and Path(positional) != Path(option):
        # `split raw --data raw2 --out o`: raw was likely meant as ROOT, not OUT.
        rule = "" if data is None else f"{argument_rule(data, name=name, data_name=data_name)}: "
        raise UsageError(
            f"{name} {positional} and --out {option} name two outputs", f"{rule}give one of them"
        )
    chosen = option if option is not None else positional
    if chosen is None and required:
        raise UsageError(f"missing {name}", f"give it after the inputs, or as --out {name}")
    return chosen


DeviceOption = Annotated[
    str,
    typer.Option(
        "--device", help="auto, cpu, cuda, cuda:N or mps.", autocompletion=_complete_device
    ),
]


def seed_in_range(value: Optional[int]) -> Optional[int]:
    """`--seed`'s check (core's one rule of seeds, runtime.seeding.check_seed) for every command
    that takes one, as a callback rather than min/max: click would print the bounds beside the
    option in --help, in its own wording."""
    from torchkit.core.runtime.seeding import check_seed

    return None if value is None else check_seed(value)


SeedOption = Annotated[
    int,
    typer.Option("--seed", callback=seed_in_range, help="Seed for Python, NumPy and torch."),
]
DeterministicOption = Annotated[
    bool,
    typer.Option("--deterministic", help="Also make cuDNN and torch use deterministic algorithms."),
]
AllowUntrainedOption = Annotated[
    bool,
    typer.Option(
        "--allow-untrained",
        help="Run a model that comes with no trained weights (a model name without --weights, "
        "or package.module:Callable that loads its own): refused by default. Random weights "
        "are drawn from seed 0 (extract-features: --seed), the same in every run.",
    ),
]


def _complete_model(incomplete: str) -> list[str]:
    from torchkit.cli.completion import complete_model_name

    return complete_model_name(incomplete)


# The model inputs of every command that takes a model spec (the one model resolver): MODEL,
# --model, --weights and --trust-checkpoint, each with one help text.

# What MODEL's help adds for the files `torchkit export` writes, by how the command takes them
# (the resolver's `exported`: refused, run in their own runtime, or loaded as TorchScript).
_EXPORTED_FILES = {
    "refuse": "",
    "runtime": ", a file `torchkit export` wrote (.onnx; .ts and .pt2 with --trust-checkpoint)",
    "module": ", a TorchScript file `torchkit export` wrote (with --trust-checkpoint)",
}


def model_help(exported: str = "refuse", *, or_model_option: bool = True) -> str:
    """MODEL's help: the model grammar, the exported files the command takes (`exported`, as
    the resolver's) and, where --model may stand for MODEL, that it may."""
    text = (
        "A torchvision model name, convnet, package.module:Callable (importable from the "
        "working directory), timm/NAME (a timm model, with the timm extra), a torchkit "
        f"checkpoint{_EXPORTED_FILES[exported]}, or a pickled model (with --trust-checkpoint)"
    )
    return text + ("; or --model." if or_model_option else ".")


def model_argument(
    exported: str = "refuse", *, metavar: str = "MODEL", or_model_option: bool = True
) -> Any:
    """The MODEL argument (`typer.Argument`) of a command that resolves it taking exported files
    as `exported` says; `or_model_option`: --model may stand for it (`model_and_rest`)."""
    return typer.Argument(
        help=model_help(exported, or_model_option=or_model_option),
        metavar=metavar,
        show_default=False,
        autocompletion=_complete_model,
    )


ModelOption = Annotated[
    Optional[str],
    typer.Option(
        "--model",
        "-m",
        metavar="MODEL",
        help="The model, as the MODEL argument takes it (give one of them).",
        show_default=False,
        autocompletion=_complete_model,
    ),
]
# eval's --model also names the architecture of a weights file given as MODEL (`FILE --model
# NAME`, the older spelling of `NAME --weights FILE`): so its own help, and -m.
EvalModelOption = Annotated[
    Optional[str],
    typer.Option(
        "--model",
        "-m",
        help="Architecture of the weights in MODEL (a plain state dict): the same as "
        "NAME --weights FILE.",
        autocompletion=_complete_model,
    ),
]
WeightsOption = Annotated[
    Optional[str],
    typer.Option(
        "--weights",
        metavar="PATH|NAME",
        help="Weights for a model given by name: a file (torchkit checkpoint, state dict, "
        ".safetensors; the classifier head takes the size the file gives it), or DEFAULT: the "
        "pretrained weights of torchvision or timm (downloaded once: needs the internet or a "
        "warm cache); torchvision also takes a weights name (IMAGENET1K_V1), timm a pretrained "
        "tag (a1_in1k). Without it, a torchvision, convnet or timm model has random weights.",
        show_default=False,
    ),
]
TrustCheckpointOption = Annotated[
    bool,
    typer.Option(
        "--trust-checkpoint",
        help="Allow model files that run code when loaded: pickled objects, TorchScript and "
        "torch.export archives, and checkpoints whose arch is package.module:Callable.",
    ),
]
# eval, export, predict and extract-features: one help for the one resolver's `ema=`.
EmaOption = Annotated[
    bool,
    typer.Option(
        "--ema",
        help="Use the checkpoint's EMA weights (the moving average train --ema keeps, whose "
        "val metric picks best.pt; in a --weights file, timm's state_dict_ema or a model_ema) "
        "instead of its model weights.",
    ),
]


def strict_reading_callback(ctx: typer.Context, value: bool) -> bool:
    """--strict also makes what the data readers meet while listing the data (a folder that
    cannot be listed) an error, for the length of the command (a command's own --strict
    option takes it as its callback too)."""
    from torchkit.core.data.strict_reading import reset_strict_reading, set_strict_reading

    token = set_strict_reading(bool(value))
    # Undone as the command line ends, on the root context: a later option that fails to
    # parse ends the command before its own context is entered, so its close never comes.
    ctx.find_root().call_on_close(lambda: reset_strict_reading(token))
    return value


StrictOption = Annotated[
    bool,
    typer.Option(
        "--strict",
        help="Stop at the first unreadable file instead of skipping it.",
        callback=strict_reading_callback,
    ),
]
WorkersOption = Annotated[
    Optional[int],
    typer.Option(
        "--workers",
        "-j",
        help="Worker processes (default: a sensible number for this machine).",
        min=0,
    ),
]
StatsOption = Annotated[
    Optional[Path],
    typer.Option(
        "--stats",
        show_default=False,
        dir_okay=False,
        help="Mean and std from `torchkit dataset-stats ROOT -o FILE.json`.",
    ),
]


def data_option(
    help: str | None = None, *, argument: str | None = None, several: bool = False
) -> Any:
    """`--data`/`-d`, the data of every data-reading command (train's is generated from the
    same spelling, core.train.config): text, whose values complete as paths, as a positional's
    do. `help`: the command's own; `argument`: the positional it stands for (`ROOT`), of which
    the help says so; `several`: it may be repeated, each adding to the positional ones."""
    if help is None:
        help = f"The data, as the {argument} argument takes it " + (
            f"(repeat for several; they add to {argument}, read after it)."
            if several
            else "(give one of them)."
        )
    return typer.Option("--data", "-d", help=help, show_default=False)


def data_and_rest(option: Any, words: list[Any], *, name: str, after: int) -> tuple[Any, list]:
    """The data given as --data or positionally (`words`: what the shell gave from its place
    on); with --data, those words are the `after` positionals that follow it (`split --data
    raw/ out/`: out/ is OUT, whether --out is given or not: product_path then holds the two to
    one output, as it does without --data). A word left over for the data's own place is the
    data given twice: a usage error."""
    from torchkit.core.io.errors import UsageError

    if option is None:
        return (words[0] if words else None), list(words[1:])
    if len(words) > after:
        raise UsageError(f"{name} given twice: {words[0]} and --data {option}", "give one of them")
    return option, list(words)


# Text, not a Path: a Path would make `https://host/x.tar` `https:/host/x.tar`.
ImageSetArgument = Annotated[
    Optional[str],
    typer.Argument(
        help="Image folder (ROOT/<class>/<image>), split root (ROOT/train/, val/, test/), flat "
        "folder of images, or CSV index with path,label (and optional split) columns; or --data.",
        metavar="ROOT",
        show_default=False,
    ),
]
ImageSetOption = Annotated[Optional[str], data_option(argument="ROOT")]


NullOption = Annotated[
    bool,
    typer.Option(
        "--null",
        "-0",
        help="With -: the paths on stdin end in NUL bytes (find -print0, xargs -0), not in line "
        "ends, so any file name is read exactly (a line break or spaces around it included).",
    ),
]


def piped_paths(inputs: list[Any], null: bool) -> Any:
    """stdin for `-` among `inputs` (wrapped as NUL-separated with --null), None without `-`;
    --null without `-` is a usage error, never ignored."""
    import sys

    if not any(str(item) == "-" for item in inputs):
        if null:
            from torchkit.core.io.errors import UsageError

            raise UsageError("--null applies to the paths piped for -", "give - among the inputs")
        return None
    if not null:
        return sys.stdin
    from torchkit.core.io.path_lists import NulSeparated

    return NulSeparated(sys.stdin)


class DataSplit(str, Enum):
    """A split of split data (`--split`), or all of them."""

    train = "train"
    val = "val"
    test = "test"
    all = "all"


def split_option(default_help: str) -> Any:
    """`--split train|val|test|all` of a data-reading command; `default_help` says what it
    reads without one."""
    return typer.Option(
        "--split",
        case_sensitive=False,
        show_default=False,
        help="The split to read of a split root (train/ val/ test/), of a CSV index with a split "
        "column, or that a training run recorded; all: every split. An error on data without "
        f"splits. Default: {default_help}.",
    )


def _image_side(param: typer.CallbackParam, value: Optional[str]) -> Optional[str]:
    """The text checked (N, or C,N,N): the command reads the side and C of it."""
    from torchkit.core.input_size import parse_image_side

    try:
        parse_image_side(value, "--image-size")
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    return value


def image_size_option(help: str) -> Any:
    """`--image-size N` of a command that crops images, also spelled `--input-size` (the name
    summary and benchmark give a sample's shape), which takes C,N,N there as well: the value is
    the text, checked (`parse_image_side` and `image_shape_channels` read it)."""
    return typer.Option(
        "--image-size",
        "--input-size",
        metavar="N",
        show_default=False,
        callback=_image_side,
        help=f"{help} Also spelled --input-size; C,N,N is N x N, C being the model's input "
        "channels (refused when it is not).",
    )


# `--image-size N` of a command that takes a sample's shape (summary, benchmark, convert-syncbn):
# the square input C,N,N, C being the model's channels.
SquareInputOption = Annotated[
    Optional[int],
    typer.Option(
        "--image-size",
        min=1,
        metavar="N",
        show_default=False,
        help="The input as an N x N image with the model's channels (as --input-size C,N,N).",
    ),
]
