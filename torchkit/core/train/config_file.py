"""`train --config FILE`: a previous run's config.json (its `options`), or a JSON/YAML file of
option names and values, as the defaults of a new run; the command line overrides it.

Keys are TrainConfig field names (`lr`, `image_size`...; `--lr` and `image-size` spellings are
accepted too). An unknown key is an error naming it. Run-specific entries of a config.json
(`out`, `resume`, `force`, the options filled from the data) are not carried over, so a replay
writes a new run folder and fills data defaults the way the first run did.

A hand-written file (no `options` block) is a recipe for one run: its `out` is honoured as
`--out` would be (relative to the working directory; `--out` on the command line overrides it),
while a `resume` or a `force: true` is refused, naming the command-line option to use instead: a
recipe starts a new run, and replacing an output takes a `--force` typed for that run. What
`--print-config` writes (`resume: null`, `force: false`) is such a recipe; like a config.json it
lists the options the data chose (`defaults_from_data`), which a replay chooses again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import difflib
import json
import math
import os
import re
import stat
from collections.abc import Collection, Iterator, Mapping
from dataclasses import fields
from pathlib import Path
from typing import IO, Any

from torchkit.core.input_size import parse_rgb_image_side
from torchkit.core.io.errors import InputError, UsageError, first_line, short_repr
from torchkit.core.io.shell_words import shell_word
from torchkit.core.runtime.launch import launch_env
from torchkit.core.train.config import TRAIN_OPTIONS, TrainConfig
from torchkit.core.train.defaults import with_pre_option_values
from torchkit.core.train.validation import fitted_to_this_machine, option_name

# Entries of a run's options that describe that run, not the recipe.
NOT_CARRIED = ("out", "resume", "force", "data_defaults", "profile_steps")
# The key of a config.json and of --print-config's output that lists the options whose value
# the data chose (the digits' 12 px, an image folder's flips...), not the user.
DEFAULTS_FROM_DATA = "defaults_from_data"


# `--config -`: the recipe is read from stdin (`train --print-config | ... | train --config -`).
STDIN = "-"
STDIN_SOURCE = "the recipe on stdin"
_PIPE_IT = "pipe a recipe in: torchkit train --print-config ... | torchkit train --config -"


def read_config_file(path: str | Path, stdin: IO[str] | None = None) -> dict[str, Any]:
    """The options in `path`: a config.json's `options` block, or the whole mapping. `-` reads
    them from `stdin`. JSON, or YAML: a .yaml or .yml file, or one without .json (stdin) that
    does not start as JSON does."""
    source = recipe_source(path)
    if source == STDIN_SOURCE:
        text = _read_stdin(stdin)
    else:
        # A mistyped name is not found (below), whatever its extension.
        if source.suffix.lower() == ".toml" and source.exists():
            raise UsageError(
                f"{source} is TOML, and --config reads JSON or YAML",
                "write it as JSON or YAML: torchkit train --print-config prints JSON",
            )
        text = _read_recipe_file(source)
    data = _parse(text, source, _is_yaml(source, text)) if text.strip() else None
    if data is None:  # an empty file, or YAML of comments alone
        raise InputError(f"{source} holds no options", _PRINT_ONE)
    if not isinstance(data, Mapping):
        raise InputError(f"{source} holds {_a_kind(data)}, not option names and values", _PRINT_ONE)
    options = data.get("options", data) if "options" in data else data
    if not isinstance(options, Mapping):
        raise InputError(f"{source}: `options` is not a mapping of option names and values")
    # A run's config.json: options it predates take the value the run used.
    carried = with_pre_option_values(options) if "options" in data else dict(options)
    # A config.json and --print-config's recipe alike list the options the data chose: those
    # are chosen again for the data this run reads (--data given anew picks its own).
    for name in _defaults_from_data(data, options, source):
        carried.pop(name, None)
    if "options" in data:
        for name in NOT_CARRIED:
            carried.pop(name, None)
    else:
        _refuse_run_keys(carried, source)
        carried.pop("data_defaults", None)  # what a run records, never an option
        carried.pop(DEFAULTS_FROM_DATA, None)
    return _checked(carried, source)


_PRINT_ONE = "torchkit train --print-config prints a recipe to start from"

# More than any recipe holds (a run's config.json of 21,841 class names is under 1 MB): a
# device such as /dev/zero, read whole, would fill the memory.
RECIPE_LIMIT = 64 * 1024 * 1024


def _read_recipe_file(source: Path) -> str:
    """The text of the recipe file `source` (UTF-8, a BOM dropped), or an error that says what
    stands at that name instead and what to give. A FIFO (`--config <(yq ...)`) is read as a
    file is, waiting for its writer as `cat` does."""
    given = shell_word(source)
    try:
        kind = source.stat().st_mode
    except FileNotFoundError:
        dangling = ", a link to nothing" if source.is_symlink() else ""
        raise InputError(
            f"config file not found: {source}{dangling}",
            f"give a run's config.json or a JSON or YAML recipe; {_PRINT_ONE}",
        ) from None
    except OSError as error:
        raise _unreadable_recipe(source, error) from None
    if stat.S_ISDIR(kind):
        inside = source / "config.json"
        hint = (
            f"give the run's recipe in it: --config {shell_word(inside)}"
            if inside.is_file()
            else f"give a JSON or YAML file; {_PRINT_ONE}"
        )
        raise UsageError(f"--config {given} is a folder, not a recipe file", hint)
    if stat.S_ISSOCK(kind):
        raise UsageError(
            f"--config {given} is a socket, not a recipe file",
            f"give a JSON or YAML file; {_PRINT_ONE}",
        )
    try:
        with open(source, "rb") as recipe:
            raw = recipe.read(RECIPE_LIMIT + 1)
    except OSError as error:
        raise _unreadable_recipe(source, error) from None
    if len(raw) > RECIPE_LIMIT:
        raise InputError(
            f"config file {source} holds more than {RECIPE_LIMIT // 2**20} MiB, "
            "more than any recipe",
            f"give a run's config.json or a JSON or YAML recipe; {_PRINT_ONE}",
        )
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise _not_utf8(f"config file {source}", raw, error) from None


def _not_utf8(what: str, raw: bytes, error: UnicodeDecodeError) -> InputError:
    return InputError(
        f"{what} is not UTF-8 text: byte 0x{raw[error.start]:02x} at offset {error.start}",
        "save it as UTF-8, the encoding JSON and YAML are read in",
    )


def _unreadable_recipe(source: Path, error: OSError) -> InputError:
    why = error.strerror or first_line(error)
    return InputError(
        f"cannot read config file {source}: {why}",
        "check that it is a file you may read, or give another with --config",
    )


def _a_kind(value: Any) -> str:
    """What a JSON or YAML value is, in its own words: a list, not Python's `list`."""
    for kind, words in ((bool, "true or false"), (str, "a string"), (list, "a list")):
        if isinstance(value, kind):
            return words
    return "a number" if isinstance(value, int | float) else f"a {type(value).__name__}"


def _is_yaml(source: str | Path, text: str) -> bool:
    """Whether a recipe is YAML: by its suffix (.yaml, .yml; .json is JSON), else, as on stdin
    or from `<(...)`, unless it starts as JSON does."""
    suffix = source.suffix.lower() if isinstance(source, Path) else ""
    if suffix in (".yaml", ".yml", ".json"):
        return suffix != ".json"
    return not text.lstrip().startswith(("{", "["))


def _read_stdin(stdin: IO[str] | None) -> str:
    """The recipe piped to stdin, as a file's text is read (UTF-8, a BOM dropped). Under
    torchrun every rank shares one stdin, and the first to read it would take it all."""
    if launch_env().world_size > 1:
        raise UsageError(
            "--config - reads the recipe from stdin, which torchrun's ranks share: each would "
            "read part of it",
            "write the recipe to a file and give --config FILE",
        )
    if stdin is None:  # started with stdin closed (`<&-`)
        raise UsageError("--config - reads the recipe from stdin, which is closed", _PIPE_IT)
    raw = stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise _not_utf8(STDIN_SOURCE, raw, error) from None
    if not text.strip():
        raise UsageError(f"{STDIN_SOURCE} is empty: --config - reads the options there", _PIPE_IT)
    return text


def _defaults_from_data(
    run: Mapping[str, Any], options: Mapping[str, Any], source: str | Path
) -> list[str]:
    """The option names a recipe says were filled from the data, to be chosen again. The
    recipe records each with the value the data chose: one whose value in the file differs was
    edited by the user and is kept. (Older files list the names alone, or map each name to
    the bare value.)"""
    chosen = run.get(DEFAULTS_FROM_DATA, [])
    if isinstance(chosen, Mapping) and all(isinstance(name, str) for name in chosen):
        recorded = {name: _recorded_value(value, source) for name, value in chosen.items()}
        return [name for name, value in recorded.items() if options.get(name, value) == value]
    if not isinstance(chosen, list) or not all(isinstance(name, str) for name in chosen):
        raise _not_data_chosen(source)
    return chosen


# Each value the data chose is recorded as `{"chosen": VALUE}`, never as `"name": VALUE`: the
# option's own line reads `"epochs": 25`, and a textual edit of it (`sed 's/"epochs": 25/
# "epochs": 40/'`) would change the record too, which would then say the data chose 40.
CHOSEN = "chosen"


def _recorded_value(entry: Any, source: str | Path) -> Any:
    """The value an entry of `defaults_from_data` records: `{"chosen": VALUE}`, or the bare
    value of files written before (no option's value is a mapping)."""
    if not isinstance(entry, Mapping):
        return entry
    if set(entry) != {CHOSEN}:
        raise _not_data_chosen(source)
    return entry[CHOSEN]


def _not_data_chosen(source: str | Path) -> InputError:
    return InputError(
        f"{source}: `defaults_from_data` is not a mapping of option names to the values "
        "the data chose",
        "give the config.json a run wrote, or a file of option names and values",
    )


def data_chosen(options: Mapping[str, Any], names: Collection[str]) -> dict[str, Any]:
    """`defaults_from_data` as a recipe records it: each option the data chose, with the value
    it chose (as `options`, the JSON form, holds it) as `{"chosen": VALUE}`."""
    return {name: {CHOSEN: options[name]} for name in sorted(names) if name in options}


# Keys of a hand-written recipe that name what one command line does, not a recipe: refused
# (`out` is honoured as --out).
NOT_IN_A_RECIPE = {
    "resume": (
        "--config starts a new run from a recipe",
        "continue a run with `torchkit train --resume RUN`, without --config",
    ),
    "force": (
        "replacing an existing output takes --force on the command line",
        "remove it from the file and give --force when you mean it",
    ),
}


# Keys of other recipes that name a torchkit option: timm's train.py writes the crop as
# `input_size: [3, 224, 224]` (or `img_size: 224`); `--input-size` is image_size's other name.
KEY_ALIASES = {"input_size": "image_size", "img_size": "image_size"}


def _field_name(key: Any) -> str:
    """The option a key of a file names: `lr`, `--lr`, `image-size` and `image_size` alike,
    and `input_size` (KEY_ALIASES) as `image_size`."""
    name = str(key).lstrip("-").replace("-", "_")
    return KEY_ALIASES.get(name, name)


def _image_side(key: Any, value: Any, source: str | Path) -> Any:
    """A shape given for the crop (`input_size: [3, 224, 224]`, timm's) as the side the command
    line's `--input-size 3,224,224` gives: 224; refused by key and file where it is not square
    or its channels are not 3. Any other value as it is."""
    if not isinstance(value, list) or not value:
        return value
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in value):
        return value  # refused as a list where a whole number goes
    text = ",".join(map(str, value))
    try:
        return parse_rgb_image_side(text, option_name("image_size"))
    except ValueError as error:  # its own hint, "(give N, or C,N,N)", is the command line's
        why = re.sub(r" \(give [^()]*\)$", "", str(error)).removeprefix(f"{short_repr(text)} ")
        raise UsageError(
            f"{short_repr(str(key))} in {source} is {_as_written(value)}, which {why}",
            "give [3, N, N], or the side N of the square crop",
        ) from None


def _refuse_run_keys(options: Mapping[str, Any], source: str | Path) -> None:
    for key, value in options.items():
        name = _field_name(key)
        # `resume: null` and `force: false` (as --print-config writes them) ask for nothing.
        if name in NOT_IN_A_RECIPE and value not in (None, False):
            why, hint = NOT_IN_A_RECIPE[name]
            raise UsageError(f"{key!r} in {source} is not taken from a config file: {why}", hint)


def _parse(text: str, source: str | Path, is_yaml: bool) -> Any:
    if is_yaml:
        try:
            import yaml
        except ImportError:
            raise UsageError(
                f"{source} is YAML, and reading YAML needs PyYAML",
                "pip install pyyaml, or use JSON",
            ) from None
        try:
            return yaml.load(text, Loader=_unique_keys_yaml_loader())  # a SafeLoader
        except DuplicateKey as error:
            raise error.input_error(source) from None
        except yaml.YAMLError as error:
            raise InputError(
                f"{source} is not valid YAML: {_yaml_problem(error)}", _FIX_THE_PLACE
            ) from error
        except ValueError as error:  # a date out of range, an integer of 5,000 digits...
            raise _unreadable_value(source, error) from error
    try:
        return load_json(text, source)
    except InputError as error:
        error.hint = error.hint or _FIX_THE_PLACE
        raise


_FIX_THE_PLACE = f"fix it at the place named; {_PRINT_ONE}"


def _yaml_problem(error: Exception) -> str:
    """PyYAML's error on one line: its problem and where (its own text spans several lines,
    with a quote of the file)."""
    problem, mark = getattr(error, "problem", None), getattr(error, "problem_mark", None)
    if problem is None:
        return " ".join(str(error).split())
    shown = " ".join(str(problem).split())
    if mark is not None:
        shown = f"line {mark.line + 1}, column {mark.column + 1}: {shown}"
    context, start = getattr(error, "context", None), getattr(error, "context_mark", None)
    if context is not None:
        shown += ", " + " ".join(str(context).split())
        if start is not None:
            shown += f" that starts on line {start.line + 1}, column {start.column + 1}"
    return shown


class DuplicateKey(ValueError):
    """A key given twice in one mapping of a JSON or YAML file (both keep the last silently)."""

    def __init__(self, key: Any, line: int | None = None) -> None:
        super().__init__(key)
        self.key, self.line = key, line

    def input_error(self, source: str | Path, what: str = "key") -> InputError:
        where = f", the second time on line {self.line}" if self.line else ""
        return InputError(
            f"{what} {self.key!r} is given twice in {source}{where}",
            f"give each {what} once: which value was meant is not clear",
        )


def _no_duplicate_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKey(key)
        seen[key] = value
    return seen


def load_json(text: str, source: str | Path, what: str = "key") -> Any:
    """`json.loads(text)`, a key given twice in one object being an InputError naming it (and
    `what` it is) and `source`, as is invalid JSON."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_pairs)
    except DuplicateKey as error:
        raise error.input_error(source, what) from None
    except json.JSONDecodeError as error:
        raise InputError(f"{source} is not valid JSON: {error}") from error
    except ValueError as error:  # an integer of more digits than Python converts
        raise _unreadable_value(source, error) from error


def _unreadable_value(source: str | Path, error: ValueError) -> InputError:
    # Python's own advice (`use sys.set_int_max_str_digits()`) is not the user's to follow.
    why = str(error).split(";")[0]
    return InputError(f"{source} holds a value Python cannot read: {why}", _FIX_THE_PLACE)


# YAML 1.2's core schema, which reads a plain scalar as true/false, an integer or a number only
# in these forms (JSON's, and 0o/0x integers). PyYAML reads YAML 1.1, where `lr: 1:30` is 90
# (base 60), `amp: no`, `on` and `y` are booleans, `epochs: 010` is 8 (octal), `1_000` 1000,
# `2024-01-01` a date, and `1e-3` (no dot) a string; in a recipe each of these is the string
# it reads as, which an option of another type refuses by name.
_YAML_12_SCALARS = {
    "tag:yaml.org,2002:bool": (r"true|True|TRUE|false|False|FALSE", "tTfF"),
    "tag:yaml.org,2002:int": (r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", "-+0123456789"),
    "tag:yaml.org,2002:float": (
        r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
        "-+0123456789.",
    ),
}
# The implicit tags of YAML 1.1 that the core schema reads otherwise or not at all (null and
# `<<` merges are kept: they read the same in both).
_YAML_11_ONLY = {
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:timestamp",
    "tag:yaml.org,2002:value",
}


def _yaml_12_int(loader: Any, node: Any) -> int:
    """A YAML 1.2 integer: decimal (`010` is 10, not YAML 1.1's octal 8), 0o octal, 0x hex."""
    text = loader.construct_scalar(node)
    sign, digits = (-1, text[1:]) if text.startswith("-") else (1, text.lstrip("+"))
    for prefix, base in (("0o", 8), ("0x", 16)):
        if digits.startswith(prefix):
            return sign * int(digits[2:], base)
    return sign * int(digits, 10)


def _unique_keys_yaml_loader() -> type:
    """PyYAML's SafeLoader reading plain scalars by YAML 1.2's core schema (above), a key given
    twice in one mapping raising DuplicateKey."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` merges, and may be overridden: that is YAML's rule
                key = self.construct_object(key_node, deep=deep)
                try:
                    if key in seen:
                        raise DuplicateKey(key, key_node.start_mark.line + 1)
                    seen.add(key)
                except TypeError:  # an unhashable key: SafeLoader reports it
                    pass
            return super().construct_mapping(node, deep=deep)

    UniqueKeyLoader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in _YAML_11_ONLY]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    for tag, (pattern, first) in _YAML_12_SCALARS.items():
        UniqueKeyLoader.add_implicit_resolver(tag, re.compile(rf"^(?:{pattern})$"), list(first))
    UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _yaml_12_int)
    return UniqueKeyLoader


def _checked(options: Mapping[str, Any], source: str | Path) -> dict[str, Any]:
    """Known names, values of the option's type (a number where a number goes...)."""
    types = {f.name: str(f.type) for f in fields(TrainConfig) if f.name in TRAIN_OPTIONS}
    checked: dict[str, Any] = {}
    for key, value in options.items():
        name = _field_name(key)
        if name not in types:
            close = difflib.get_close_matches(name, sorted(types), n=1)
            hint = f"did you mean {close[0]}?" if close else "the keys are train's option names"
            raise UsageError(f"unknown option {short_repr(key)} in {source}", hint)
        if name in checked:  # `lr` and `--lr`: one option given twice
            raise InputError(
                f"{option_name(name)} is given twice in {source}",
                "give each key once: which value was meant is not clear",
            )
        if value == "":  # as on the command line: a typo or a template's blank, never "not given"
            raise UsageError(
                f"invalid {option_name(name)} '' in {source}: an empty value",
                "give a value, or leave the key out",
            )
        if name == "image_size":
            value = _image_side(key, value, source)
        shown = _as_written(value)
        value = _as_choice(value, TRAIN_OPTIONS[name].choices)
        if isinstance(value, list):
            value = tuple(value)
        if not _fits(value, types[name]):
            raise UsageError(
                f"{option_name(name)} in {source} is {shown}, not {_described(types[name])}",
                _how_to_write(types[name]),
            )
        checked[name] = _as_floats(_home_expanded(name, value), types[name])
    return checked


# The options whose value is a path (or may be one: a model's checkpoint, a weights file).
PATH_OPTIONS = ("data", "out", "weights", "model", "class_weights")


def _home_expanded(name: str, value: Any) -> Any:
    """A path option's `~/...` with the home folder in its place, as the shell puts it in an
    unquoted `--out ~/runs/x`: a recipe's `out: ~/runs/x` trained into a folder named `~` in
    the working directory, and the summary's `~/runs/x` read as the home folder's."""
    if name in PATH_OPTIONS and isinstance(value, str) and value.startswith("~"):
        return os.path.expanduser(value)
    return value


def _as_floats(value: Any, annotation: str) -> Any:
    """A whole number where a number goes, as the float the command line makes of it (`lr: 1`
    as 1.0, `mean: [0, 0, 1]` as 0.0s and 1.0): a recipe then prints, and a run records in its
    config.json, what `--lr 1` gives. One too large for a float is inf, which the run refuses."""
    if "float" not in annotation:
        return value

    def as_float(number: Any) -> Any:
        if not isinstance(number, int) or isinstance(number, bool):
            return number
        try:
            return float(number)
        except OverflowError:
            return math.inf if number > 0 else -math.inf

    return tuple(map(as_float, value)) if isinstance(value, tuple) else as_float(value)


def _as_choice(value: Any, choices: tuple[str, ...]) -> Any:
    """A choice spelt in any case as the choice (`AdamW` as adamw), as the command line takes
    it; any other value as it is."""
    if not isinstance(value, str):
        return value
    return next((choice for choice in choices if choice.lower() == value.lower()), value)


def _as_written(value: Any) -> str:
    """A value as the file writes it: [0.1], not (0.1,); null, true, a YAML date 2024-01-01,
    not Python's None, True, datetime.date(2024, 1, 1)."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, datetime.date):
        return value.isoformat()
    return short_repr(value)


def _fits(value: Any, annotation: str) -> bool:
    """Whether `value` suits a TrainConfig annotation such as `float | None`."""
    if value is None:
        return "None" in annotation
    if isinstance(value, tuple):
        return "tuple[" in annotation and _fits_items(value, annotation)
    # A single value fits the annotation's other kinds, not a list's items (`milestones: 3`).
    annotation = " | ".join(k for k in annotation.split(" | ") if not k.startswith("tuple["))
    if isinstance(value, bool):
        return "bool" in annotation
    if isinstance(value, int):
        return "int" in annotation or "float" in annotation
    if isinstance(value, float):
        return "float" in annotation
    if isinstance(value, str):
        return "str" in annotation
    return False


# What a value of each TrainConfig annotation is, in a JSON or YAML file's words.
_KINDS = {"int": "a whole number", "float": "a number", "str": "a string", "bool": "true or false"}


def _described(annotation: str) -> str:
    """`int | None` as "a whole number or null", `tuple[float, ...]` as "a list of numbers",
    `tuple[float, float]` as "a list of 2 numbers": what a user writes, not Python's types."""
    kind, _, optional = annotation.partition(" | ")
    if kind.startswith("tuple["):
        items = [item.strip() for item in kind[len("tuple[") : -1].split(",")]
        plural = "whole numbers" if items[0] == "int" else "numbers"
        count = "" if items[-1] == "..." else f"{len(items)} "  # crop_scale: "2 numbers"
        described = f"a list of {count}{plural}"
    else:
        described = _KINDS.get(kind, kind)
    if optional != "None":
        return described
    return described.replace(" or ", ", ") + " or null"


def _how_to_write(annotation: str) -> str:
    """How a recipe writes a value of `annotation`: not as the command line types it (`--mean
    0.5,0.5,0.5`, `--epochs 3`), but as a JSON or YAML value of that kind."""
    kind = annotation.partition(" | ")[0]
    if kind.startswith("tuple["):
        return 'write a list in brackets, such as [1, 2], not a string such as "1,2"'
    examples = {
        "int": "a whole number such as 3",
        "float": "a number such as 0.1",
        "bool": "true or false",
    }
    if kind in examples:
        return f"write {examples[kind]}, without quotes"
    return 'write a string, in quotes where YAML would read a number, true or null: "2024"'


def _fits_items(values: tuple, annotation: str) -> bool:
    """Whether a list suits `tuple[int, ...]` (any length) or `tuple[float, float]` (that
    length): the command line's parse would refuse a wrong count or a fraction of an int."""
    inner = annotation.split("tuple[", 1)[1].split("]", 1)[0]
    kinds = [kind.strip() for kind in inner.split(",")]
    if kinds[-1] == "...":
        kinds = kinds[:1] * len(values)
    if len(kinds) != len(values):
        return False
    return all(
        not isinstance(v, bool) and isinstance(v, int if kind == "int" else (int, float))
        for v, kind in zip(values, kinds, strict=True)
    )


def apply_config_file(
    config: TrainConfig,
    file_options: Mapping[str, Any],
    given: Collection[str],
    source: str | Path = "the recipe",
) -> TrainConfig:
    """`config` (from the command line) with every option not `given` there taken from the
    file `source`; values are checked as the command line's are when the run starts, but for
    --threads and --workers above what this machine can use (a recipe recorded on a larger
    one), which are chosen again with a warning (`fitted_to_this_machine`)."""
    changes = {name: value for name, value in file_options.items() if name not in given}
    try:
        config = dataclasses.replace(config, **changes)
    except TypeError as error:  # pragma: no cover - names were checked against the fields
        raise UsageError(f"bad config file option: {error}") from error
    return fitted_to_this_machine(config, changes, f"{source}'s")


def recipe_source(path: str | Path) -> str | Path:
    """How errors name the recipe `--config` gave: its path, or `the recipe on stdin`."""
    return STDIN_SOURCE if str(path) == STDIN else Path(path)


@contextlib.contextmanager
def naming_the_recipe(
    source: str | Path, file_options: Collection[str], given: Collection[str]
) -> Iterator[None]:
    """A usage error about an option whose value the recipe gave (a range or a choice, checked
    when the run is planned: "--lr must be positive, not -1") names the recipe in front
    ("recipe.json: --lr must be positive, not -1"): the command line has no --lr to fix."""
    try:
        yield
    except UsageError as error:
        from_file = [name for name in file_options if name not in given]
        if any(_names_option(error.message, name) for name in from_file):
            error.message = f"{source}: {error.message}"
        raise


def _names_option(message: str, name: str) -> bool:
    """Whether `message` names the option `name` as the command line spells it (`--lr`, not
    within `--lr-min`)."""
    return re.search(rf"(?<![\w-]){re.escape(option_name(name))}(?![\w-])", message) is not None


__all__ = [
    "apply_config_file",
    "naming_the_recipe",
    "option_name",
    "read_config_file",
    "recipe_source",
]
