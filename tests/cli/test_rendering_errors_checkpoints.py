"""The shared machinery every command relies on: rendering, the error boundary, atomic files,
output checks, devices, seeding and checkpoint loading."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import typer
from checkpoints import write_convnet_checkpoint
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process
from torch import nn

from torchkit.cli import app
from torchkit.cli.app import TorchkitGroup
from torchkit.cli.options import ForceOption, FormatOption, OutputOption
from torchkit.cli.render import OutputFormat, Table, emit, render_json, to_json_value
from torchkit.core.io.errors import (
    CheckpointError,
    DeviceError,
    InputError,
    UsageError,
    first_and_more,
)
from torchkit.core.io.files import (
    atomic_path,
    atomic_write,
    atomic_write_bytes,
    atomic_write_text,
    require_input,
)
from torchkit.core.models.checkpoint import (
    extract_state_dict,
    load_checkpoint,
    load_weights_into,
    save_checkpoint,
    strip_module_prefix,
)
from torchkit.core.runtime.device import resolve_device
from torchkit.core.runtime.seeding import capture_rng_state, restore_rng_state, seed_everything

ERROR_LINE = re.compile(r"^Error: .+ \(.+\)$")
LONG_VALUE = "/data/" + "very-long-folder-name/" * 8 + "model.pt"

# A small app built like the real one (TorchkitGroup, shared options, emit) to test the machinery
# on its own, independently of any command.
demo = typer.Typer(cls=TorchkitGroup, pretty_exceptions_enable=False)


@demo.callback()
def _demo_root() -> None:
    pass


@demo.command("table")
def _demo_table(
    fmt: FormatOption = OutputFormat.table,
    output: OutputOption = None,
    force: ForceOption = False,
) -> None:
    rows = [["alpha", 1, 0.5, True], ["beta", 2, float("nan"), False], ["path", 3, 1e-3, None]]
    data = {
        "rows": [
            {"name": "alpha", "count": 1, "score": 0.5, "ok": True},
            {"name": "beta", "count": 2, "score": float("nan"), "ok": False},
        ],
        "path": LONG_VALUE,
        "mean": np.float32(0.25),
        "counts": np.array([1, 2, 3]),
    }
    table = Table(["name", "count", "score", "ok"], rows, title="demo")
    other = Table(["key", "value"], [["path", LONG_VALUE]])
    emit(tables=[table, other], data=data, fmt=fmt, output=output, force=force)


@demo.command("fail")
def _demo_fail(kind: str) -> None:
    if kind == "input":
        raise InputError("bad file [bold]x[/bold].png with shape [1, 2] [/]", "check [red]")
    if kind == "usage":
        raise UsageError("--a and --b contradict each other", "pass only one")
    if kind == "oom":
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    if kind == "interrupt":
        raise KeyboardInterrupt
    raise ValueError("something odd\nsecond line")


# Rendering -------------------------------------------------------------------------------------


def test_json_output_has_real_numbers_and_null_for_nan(runner):
    result = runner.invoke(demo, ["table", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["rows"][0] == {"name": "alpha", "count": 1, "score": 0.5, "ok": True}
    assert data["rows"][1]["score"] is None  # NaN is not valid JSON
    assert isinstance(data["rows"][0]["count"], int)
    assert data["mean"] == 0.25 and isinstance(data["mean"], float)  # numpy scalar
    assert data["counts"] == [1, 2, 3]  # numpy array
    assert result.stderr == ""


def test_to_json_value_handles_tensors_paths_and_infinities():
    value = {
        1: (float("inf"), -float("inf")),
        "t": torch.tensor([[1.5, float("nan")]]),
        "s": torch.tensor(3),
        "p": Path("a/b"),
    }
    assert to_json_value(value) == {"1": [None, None], "t": [[1.5, None]], "s": 3, "p": "a/b"}
    assert json.loads(render_json(value))["t"] == [[1.5, None]]


def test_csv_output_is_the_first_table(runner):
    result = runner.invoke(demo, ["table", "--format", "csv"])
    assert result.exit_code == 0
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows[0] == ["name", "count", "score", "ok"]
    assert rows[1] == ["alpha", "1", "0.5", "True"]
    assert rows[2][:2] == ["beta", "2"] and rows[2][2] == "nan"
    assert rows[3] == ["path", "3", "0.001", ""]  # None is an empty cell
    assert len(rows) == 4


def test_table_output_is_plain_and_keeps_long_values_whole(runner):
    result = runner.invoke(demo, ["table"])
    assert result.exit_code == 0
    assert "\x1b[" not in result.stdout  # no colour when stdout is not a terminal
    assert "demo" in result.stdout
    assert LONG_VALUE in result.stdout  # not cut with an ellipsis at 80 columns
    lines = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if "│" in line}
    assert "0.5000" in lines["alpha"] and "yes" in lines["alpha"]
    assert "nan" in lines["beta"] and "no" in lines["beta"]


def test_control_characters_of_names_are_escaped_in_tables_and_kept_in_json(tmp_path):
    # A class folder named with a line break read as two rows of the table ("new", "line"), a
    # carriage return vanished (the name shown was not the folder's) and an escape sequence
    # reached the terminal.
    # U+2028 and U+2029 too, line breaks to str.splitlines: such a row was cut in two lines.
    names = ["new\nline", "tab\there", "cr\rback", "esc\x1b[31mred", "c1\x85next"]
    names += ["ls\u2028sep", "ps\u2029para"]
    root = write_image_folder(tmp_path / "data", dict.fromkeys(names, 1))
    shown = run_torchkit_in_process("dataset-stats", root, "-j", "0")
    assert shown.returncode == 0, shown.stderr
    for name in names:
        assert repr(name)[1:-1] in shown.stdout
        assert len([line for line in shown.stdout.split("\n") if repr(name)[1:-1] in line]) == 1
    assert not any(c in shown.stdout for c in "\t\r\x1b\x85\u2028\u2029")
    written = run_torchkit_in_process("dataset-stats", root, "-j", "0", "--format", "json")
    assert sorted(c["name"] for c in json.loads(written.stdout)["classes"]) == sorted(names)


def test_a_file_name_with_a_line_break_keeps_error_and_warning_lines_one_line(tmp_path):
    # "Error: unreadable image a/bad" and "name.jpg: not an image ..." on a line of its own:
    # a script taking the Error line, or the last line, read half of it.
    root = write_image_folder(tmp_path / "data", {"a": 1})
    (root / "a" / "bad\nname.jpg").write_bytes(b"not an image")
    strict = run_torchkit_in_process("dataset-stats", root, "--strict", "-j", "0")
    assert strict.returncode == 1
    line = error_line(strict.stderr, besides="nothing")
    assert f"unreadable image {root}/a/bad\\nname.jpg: " in line
    skipped = run_torchkit_in_process("dataset-stats", root, "--format", "json", "-j", "0")
    assert skipped.returncode == 0 and skipped.stderr.startswith("Warning: ")
    assert [json.loads(skipped.stdout)["unreadable"][0]["path"]] == ["a/bad\nname.jpg"]
    write_convnet_checkpoint(tmp_path / "m.pt", in_channels=3, image_size=8, classes="a")
    warned = run_torchkit_in_process(
        "predict", tmp_path / "m.pt", root, "--device", "cpu", "-q", "-j", "0"
    )
    assert warned.returncode == 0, warned.stderr
    assert all(line.startswith("Warning: ") for line in warned.stderr.splitlines()), warned.stderr


@pytest.mark.parametrize("width", [40, 60])
def test_a_table_too_wide_for_the_terminal_loses_no_character(monkeypatch, width):
    # predict --topk 5 with CJK class names: 16 columns rich squeezed under one wide character
    # (every class name vanished at 60 columns) or to nothing (at 40).
    from collections import Counter

    from rich.console import Console

    from torchkit.cli import console

    columns = ["path", "label", "class", "class_index", "probability", "error"]
    columns += [f"{name}_{k}" for k in range(1, 6) for name in ("class", "probability")]
    row = ["猫/猫_0.png", "猫", "猫", 3, 0.25, None] + ["猫", 0.125] * 5
    terminal = io.StringIO()
    monkeypatch.setattr(
        console, "stdout", Console(file=terminal, force_terminal=True, width=width, soft_wrap=True)
    )
    emit(tables=[Table(columns, [row], title="Predictions")], data=None)

    def characters(text: str) -> Counter:
        return Counter(c for c in text if not c.isspace() and not "\u2500" <= c <= "\u257f")

    shown = re.sub(r"\x1b\[[0-9;]*m", "", terminal.getvalue())
    written = " ".join([*columns, "Predictions", *("" if v is None else str(v) for v in row)])
    assert characters(written.replace("0.25", "0.2500").replace("0.125", "0.1250")) <= (
        characters(shown)
    )


def test_a_piped_table_of_hundreds_of_columns_loses_no_character():
    # predict --topk 200 piped or written with -o rows.txt: 406 columns in 1000 cells left
    # every class name out.
    from torchkit.cli.render import render_plain_tables

    names = [chr(0x4E00 + index) for index in range(250)]
    text = render_plain_tables([Table([f"class_{k}" for k in range(250)], [names])])
    assert all(name in text for name in names)


@pytest.mark.parametrize("fmt", list(OutputFormat))
def test_a_character_stdouts_encoding_lacks_is_escaped_not_an_error(monkeypatch, fmt):
    # PYTHONIOENCODING=latin-1 (or a Latin-1 locale): a CJK class name ended the finished
    # command with an internal `Error: UnicodeEncodeError` line and no result.
    from torchkit.cli import console

    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, "latin-1", write_through=True))
    console.write_names_as_bytes()
    data = {"name": "猫 é", "file": "caf\udcff.png"}
    emit(tables=[Table(["name", "file"], [list(data.values())])], data=data, fmt=fmt)
    written = raw.getvalue()
    if fmt == OutputFormat.json:
        assert json.loads(written.decode("latin-1")) == data
    else:
        assert b"\\u732b \xe9" in written and b"caf\xff.png" in written


@pytest.mark.parametrize("encoding", ["cp1252", "ascii", "latin-1"])
def test_a_table_on_a_stdout_without_box_drawing_characters_is_drawn_in_ascii(
    monkeypatch, encoding
):
    # Its lines reached stdout as escapes: `\u250f\u2501\u2501...\u2503 name \u2503`.
    from torchkit.cli import console

    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding, write_through=True))
    console.write_names_as_bytes()
    emit(tables=[Table(["name", "count"], [["alpha", 1]], title="Counts")], data=None)
    lines = raw.getvalue().decode(encoding).splitlines()
    assert "\\u" not in "".join(lines), lines
    assert lines[0] == "Counts" and lines[1].startswith("+-") and "| alpha" in lines[4], lines


@pytest.mark.parametrize("encoding", ["cp1252", "ascii", "latin-1"])
@pytest.mark.parametrize("terminal", [False, True])
def test_a_table_stays_aligned_on_a_stdout_that_lacks_its_characters(
    monkeypatch, encoding, terminal
):
    # PYTHONIOENCODING=ascii torchkit summary: rich laid the table out for `1×3×8×8`, then the
    # stream wrote `1\xd73\xd78\xd78`, and each such row stuck out past the table's edge.
    from rich.console import Console

    from torchkit.cli import console
    from torchkit.cli.render import print_on_terminal

    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding, write_through=True))
    console.write_names_as_bytes()
    rows = [["1\u00d73\u00d78\u00d78", "caf\u00e9"], ["\u732b\u732b", "caf\udcff.png"], ["a", "b"]]
    table = Table(["Shape", "Name \u2192 file"], rows, title="Model \u2014 1\u00d73", note="\u2026")
    if terminal:
        screen = Console(file=sys.stdout, force_terminal=True, width=60, color_system=None)
        print_on_terminal([table], screen)
    else:
        emit(tables=[table], data=None, fmt=OutputFormat.table)
    # Each byte is one cell: the encoding's own characters, and a name's byte that is not
    # UTF-8 (which a terminal shows as one replacement character).
    lines = raw.getvalue().splitlines()
    box = [line for line in lines if line[:1] in (b"|", b"+")]
    assert len(box) == 7 and len({len(line) for line in box}) == 1, lines
    text = raw.getvalue().decode("latin-1")  # each byte as itself
    if encoding == "ascii":  # torchkit's own symbols as ASCII, other characters escaped
        assert "1x3x8x8" in text and "Model - 1x3" in text and "caf\\xe9" in text
    else:  # what the encoding holds, as itself
        assert "1\xd73\xd78\xd78" in text and "caf\xe9 " in text
    assert "caf\xff.png" in text
    assert "\\u732b\\u732b" in text  # escaped as the stream escapes it, before the layout


@pytest.mark.parametrize("encoding", ["cp1252", "ascii", "latin-1"])
def test_json_on_a_stdout_that_lacks_a_character_is_still_json(monkeypatch, encoding):
    # A piped stdout on Windows (cp1252), PYTHONIOENCODING=ascii: the encoder's own escapes of
    # an emoji or an accent (`\U0001f431`, `\xe9`) made text that json.loads refused.
    from torchkit.cli import console

    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding, write_through=True))
    console.write_names_as_bytes()
    data = {"name": "cat \U0001f431", "accent": "caf\u00e9", "file": "caf\udcff.png"}
    emit(tables=[Table(list(data), [list(data.values())])], data=data, fmt=OutputFormat.json)
    assert json.loads(raw.getvalue().decode(encoding)) == data


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_output_file_needs_force_to_be_replaced(runner, tmp_path, fmt):
    target = tmp_path / f"out.{fmt}"
    first = runner.invoke(demo, ["table", "--format", fmt, "-o", str(target)])
    assert first.exit_code == 0, first.stderr
    assert first.stdout == ""  # the result went to the file
    written = target.read_text()
    assert "alpha" in written and "\x1b[" not in written
    if fmt == "json":
        assert json.loads(written)["rows"][0]["count"] == 1
    if fmt == "table":
        assert LONG_VALUE in written

    target.write_text("keep me")
    refused = runner.invoke(demo, ["table", "--format", fmt, "-o", str(target)])
    assert refused.exit_code == 1
    assert refused.stderr == (
        f"Error: output already exists: {target} (pass --force to overwrite it)\n"
    )
    assert target.read_text() == "keep me"

    forced = runner.invoke(demo, ["table", "--format", fmt, "-o", str(target), "--force"])
    assert forced.exit_code == 0
    assert target.read_text() == written
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]  # no temp files left


# The error boundary ----------------------------------------------------------------------------


def test_torchkit_error_is_one_line_and_markup_is_not_interpreted(runner):
    result = runner.invoke(demo, ["fail", "input"])
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: bad file [bold]x[/bold].png with shape [1, 2] [/] (check [red])\n"
    )
    assert result.stdout == ""


def test_core_usage_error_exits_2(runner):
    result = runner.invoke(demo, ["fail", "usage"])
    assert result.exit_code == 2
    assert result.stderr == "Error: --a and --b contradict each other (pass only one)\n"


def test_unexpected_exception_is_one_line_with_a_debug_hint(runner):
    result = runner.invoke(demo, ["fail", "other"])
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: ValueError: something odd (set TORCHKIT_DEBUG=1 to see the traceback)\n"
    )


def test_out_of_memory_gets_a_useful_hint(runner):
    result = runner.invoke(demo, ["fail", "oom"])
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: the GPU ran out of memory (use a smaller --batch-size")


def test_keyboard_interrupt_exits_130(runner):
    result = runner.invoke(demo, ["fail", "interrupt"])
    assert result.exit_code == 130
    assert "Traceback" not in result.stderr


def test_debug_env_shows_the_traceback(runner, monkeypatch):
    monkeypatch.setenv("TORCHKIT_DEBUG", "1")
    result = runner.invoke(demo, ["fail", "other"])
    assert result.exit_code == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert "ValueError: something odd" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("Error: ValueError: something odd")


@pytest.mark.parametrize("value", ["off", "OFF", "False", " no ", "0", ""])
def test_debug_env_switched_off_in_any_spelling_keeps_the_one_line(runner, monkeypatch, value):
    """TORCHKIT_DEBUG=off (TORCHKIT_BYTECODE_CACHE's word) or False showed the traceback."""
    monkeypatch.setenv("TORCHKIT_DEBUG", value)
    result = runner.invoke(demo, ["fail", "other"])
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: ValueError: something odd (set TORCHKIT_DEBUG=1 to see the traceback)\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["table", "--format", "xml"], "Invalid value for '--format'"),
        (["table", "--bogus"], "No such option: --bogus"),
        (["nosuch"], "No such command 'nosuch'"),
    ],
)
def test_command_line_mistakes_are_one_line_and_exit_2(runner, args, message):
    result = runner.invoke(demo, args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and ERROR_LINE.match(lines[0]), result.stderr
    assert message in lines[0] and "--help')" in lines[0]


def test_real_process_error_is_one_line_exit_1(run_torchkit, tmp_path):
    existing = tmp_path / "report.json"
    existing.write_text("{}")
    done = run_torchkit("env", "--format", "json", "-o", str(existing))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"Error: output already exists: {existing} (pass --force to overwrite it)"
    ]
    assert done.stdout == ""
    assert existing.read_text() == "{}"


def test_real_process_usage_error_exits_2(run_torchkit):
    done = run_torchkit("env", "--format", "yaml")
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and ERROR_LINE.match(lines[0]), done.stderr
    assert "Traceback" not in done.stderr and "\x1b[" not in done.stderr  # a pipe: no colour


def test_real_process_colour_only_on_terminals_and_never_with_no_color(run_torchkit):
    # FORCE_COLOR makes rich treat the pipe as a terminal; NO_COLOR must still win over it.
    coloured = run_torchkit("env", "--format", "yaml", env={"FORCE_COLOR": "1"})
    assert "\x1b[1;31mError:" in coloured.stderr
    plain = run_torchkit("env", "--format", "yaml", env={"FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert plain.returncode == 2
    assert not re.search(r"\x1b\[[0-9;]*3[0-9]m", plain.stderr)  # no foreground colour


@pytest.mark.parametrize(
    ("args", "stream", "expected", "width"),
    [
        (["env", "--format", "yaml"], "stderr", "Error: ", "0"),
        (["split", "--help"], "stdout", "Usage:", "abc"),
    ],
)
def test_real_process_columns_zero_still_prints(run_torchkit, args, stream, expected, width):
    # COLUMNS=0 (a size nobody knows): rich made consoles 0 columns wide, which printed
    # nothing, not even the Error line; FORCE_COLOR: as on a terminal. typer's TERMINAL_WIDTH:
    # 0 left --help blank, a word made it a ValueError traceback.
    environment = {"COLUMNS": "0", "LINES": "0", "FORCE_COLOR": "1", "TERMINAL_WIDTH": width}
    done = run_torchkit(*args, env=environment)
    shown = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", getattr(done, stream))
    assert shown.lstrip().startswith(expected), (done.returncode, done.stdout, done.stderr)


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("100000000", "1000"), ("9" * 30, "1000"), ("1000", "1000"), ("120", "120"), ("0", None),
        ("３", None),  # full-width digits: unknown (measured), where it made help 3 columns wide
    ],
)  # fmt: skip
def test_a_terminal_size_past_the_widest_is_taken_as_the_widest(monkeypatch, given, kept):
    from torchkit.cli import console

    for name in ("COLUMNS", "LINES", "TERMINAL_WIDTH"):
        monkeypatch.setenv(name, given)
    console.unknown_terminal_size_as_unset()
    for name in ("COLUMNS", "LINES", "TERMINAL_WIDTH"):
        assert os.environ.get(name) == kept, name


def test_real_process_help_under_a_huge_columns_is_as_wide_as_the_widest(run_torchkit):
    # COLUMNS=100000000: rich padded each line of --help to that width, 18 s and 750 MB.
    done = run_torchkit("--help", env={"COLUMNS": "100000", "TERMINAL_WIDTH": "100000"})
    assert done.returncode == 0 and "Usage:" in done.stdout
    assert max(map(len, done.stdout.splitlines())) <= 1000


def test_real_process_debug_shows_traceback(run_torchkit, tmp_path):
    existing = tmp_path / "report.json"
    existing.write_text("{}")
    done = run_torchkit("env", "-o", str(existing), env={"TORCHKIT_DEBUG": "1"})
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert "OutputExistsError" in done.stderr
    assert ERROR_LINE.match(done.stderr.strip().splitlines()[-1])


# Files -----------------------------------------------------------------------------------------


def test_atomic_write_failure_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "report.csv"
    target.write_text("old contents")
    with pytest.raises(RuntimeError, match="disk on fire"), atomic_write(target) as handle:
        handle.write("half of the new")
        raise RuntimeError("disk on fire")
    assert target.read_text() == "old contents"
    assert [p.name for p in tmp_path.iterdir()] == ["report.csv"]


def test_atomic_writers_replace_and_create_folders(tmp_path):
    target = tmp_path / "sub" / "dir" / "out.txt"
    atomic_write_text(target, "a,b\n")
    assert target.read_text() == "a,b\n"
    atomic_write_bytes(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert [p.name for p in target.parent.iterdir()] == ["out.txt"]


def test_atomic_path_renames_only_on_success(tmp_path):
    target = tmp_path / "model.pt"
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp != target
        torch.save({"w": torch.ones(2)}, tmp)
        assert not target.exists()
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.ones(2))
    with pytest.raises(KeyboardInterrupt), atomic_path(target) as tmp:
        tmp.write_bytes(b"partial")
        raise KeyboardInterrupt
    assert torch.load(target, weights_only=True)["w"].shape == (2,)
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_require_input(tmp_path):
    with pytest.raises(InputError, match="not found") as caught:
        require_input(tmp_path / "missing.pt", what="checkpoint")
    assert caught.value.hint == "check the path"
    with pytest.raises(InputError, match="not a file"):
        require_input(tmp_path, kind="file")
    with pytest.raises(InputError, match="not a folder"):
        require_input(__file__, kind="dir")


# Devices and seeding ---------------------------------------------------------------------------


def test_resolve_device_cpu_and_bad_names():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    for bad in ("bogus", "gpu", "auto:1", "cuda:x"):
        with pytest.raises(UsageError, match="unknown device"):
            resolve_device(bad)


def test_resolve_device_takes_index_0_of_cpu_and_mps_only():
    assert resolve_device("cpu:0") == torch.device("cpu")
    for spec in ("cpu:5", "CPU:1", "mps:3"):
        with pytest.raises(UsageError, match="there is one (CPU|MPS) device"):
            resolve_device(spec)


@pytest.mark.parametrize("spec", ["cpu:5", "mps:3"])
@pytest.mark.parametrize("command", ["train", "eval", "predict"])
def test_a_device_index_that_cannot_exist_is_refused(tmp_path, command, spec):
    # Before: --device cpu:5 ran on the CPU, mps:3 on MPS 0, the index silently dropped.
    data = write_image_folder(tmp_path / "data", {"a": 1, "b": 1})
    model = tmp_path / "m.pt"
    write_convnet_checkpoint(model, in_channels=3, image_size=8, classes="ab")
    out = tmp_path / "out"
    given = {
        "train": ("train", "--data", data, "--model", "convnet", "--out", out, "--epochs", "1"),
        "eval": ("eval", model, "--data", data, "--out", out),
        "predict": ("predict", model, data),
    }[command]
    result = run_torchkit_in_process(*given, "--device", spec)
    kind = spec.split(":")[0]
    assert result.returncode == 2, result.stderr
    assert error_line(result.stderr) == (
        f"Error: --device {spec}: there is one {kind.upper()} device, {kind}:0 "
        f"(use --device {kind})"
    )
    assert result.stdout == "" and not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without usable CUDA")
@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "cuda:1"])
def test_resolve_device_cuda_unavailable(spec):
    with pytest.raises(DeviceError) as caught:
        resolve_device(spec)
    assert "CUDA is not available" in caught.value.message
    assert "torchkit env" in caught.value.hint and "--device cpu" in caught.value.hint


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_resolve_device_cuda_index_out_of_range():
    count = torch.cuda.device_count()
    assert resolve_device("cuda") == torch.device("cuda", 0)
    with pytest.raises(DeviceError, match="only"):
        resolve_device(f"cuda:{count}")


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_seed_everything_repeats_python_numpy_and_torch():
    seed_everything(123)
    first = _draws()
    seed_everything(123)
    assert _draws() == first
    seed_everything(124)
    assert _draws() != first


def test_deterministic_mode_is_switched_on(monkeypatch):
    """torch's deterministic algorithms on (warn only), cuDNN deterministic without benchmark,
    cuBLAS's workspace set; a plain seed changes none of them."""
    from torchkit.core.runtime.seeding import use_deterministic_algorithms

    monkeypatch.setattr(torch.backends.cudnn, "deterministic", False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    try:
        use_deterministic_algorithms(False)
        seed_everything(0)
        assert not torch.are_deterministic_algorithms_enabled()
        assert not torch.backends.cudnn.deterministic and torch.backends.cudnn.benchmark
        assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        seed_everything(0, deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        use_deterministic_algorithms(*before)


def test_rng_state_round_trip_through_a_weights_only_checkpoint(tmp_path):
    seed_everything(7)
    np.random.randn()  # leaves a cached Gaussian in NumPy's legacy state
    state = capture_rng_state()
    expected = _draws()
    save_checkpoint({"rng_state": state}, tmp_path / "ckpt.pt")
    seed_everything(99)
    restore_rng_state(load_checkpoint(tmp_path / "ckpt.pt")["rng_state"])
    assert _draws() == expected


# Checkpoints -----------------------------------------------------------------------------------


def _state_dict() -> dict:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).state_dict()


def test_load_checkpoint_refuses_pickled_modules_without_trust(tmp_path):
    path = tmp_path / "whole_model.pt"
    torch.save(nn.Linear(3, 2), path)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    assert "torch.nn.modules.linear.Linear" in caught.value.message
    assert "--trust-checkpoint" in caught.value.hint
    assert isinstance(load_checkpoint(path, trust_checkpoint=True), nn.Linear)


def test_load_checkpoint_plain_state_dict_and_legacy_format(tmp_path):
    state = _state_dict()
    torch.save(state, tmp_path / "new.pt")
    torch.save(state, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    for name in ("new.pt", "old.pt"):
        loaded = load_checkpoint(tmp_path / name)
        assert loaded.keys() == state.keys()
        assert all(torch.equal(loaded[k], state[k]) for k in state)


NOT_TORCH = "not a PyTorch checkpoint (neither torch.save's zip archive nor a pickle)"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.pt", b"", "checkpoint is empty (0 bytes)"),
        # Before: torch's own errors ("IndexError: list index out of range", "KeyError: 101").
        ("junk.pt", b"this is not a checkpoint\n" * 4, NOT_TORCH),
        ("text.pt", b"{'a': 1}", NOT_TORCH),
        ("model.py", b"import torch\nprint(1)\n", NOT_TORCH),
        ("zip.pt", b"PK\x03\x04 not really a zip", "cannot read checkpoint"),
    ],
)
def test_load_checkpoint_bad_files(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    for trust in (False, True):
        with pytest.raises(CheckpointError, match=re.escape(message)) as caught:
            load_checkpoint(path, trust_checkpoint=trust)
        assert "--trust-checkpoint" not in str(caught.value)  # garbage is not a pickled model


def test_a_python_file_given_as_a_model_says_how_code_is_named(tmp_path, runner, monkeypatch):
    """`summary mynet.py`: the hint was 'give the .pt/.pth file torch.save wrote'; a model in a
    Python file is named module:Callable (models.md)."""
    (tmp_path / "mynet.py").write_text(
        "from torch import nn\n\ndef build():\n    return nn.Linear(2, 3)\n"
    )
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(tmp_path / "mynet.py")
    assert caught.value.hint == (
        "a model in Python code is named module:Callable, mynet:NAME for the function or class "
        "NAME in mynet.py, from the folder that holds it; its weights are the .pt/.pth file "
        "torch.save wrote"
    )
    assert NOT_TORCH in caught.value.message
    # and the name the hint gives works, from the folder that holds it
    monkeypatch.chdir(tmp_path)
    given = runner.invoke(app, ["summary", "mynet.py"])
    assert given.exit_code != 0
    assert error_line(given.stderr).endswith(f"({caught.value.hint})")
    result = runner.invoke(app, ["summary", "mynet:build", "-i", "2", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["totals"]["total_params"] == 2 * 3 + 3
    # The code given as --weights, its model already named so: the hint says what weights are
    # (before: only how code is named, which the command line already did).
    weights = runner.invoke(app, ["summary", "mynet:build", "--weights", "mynet.py", "-i", "2"])
    assert weights.exit_code != 0
    assert error_line(weights.stderr).endswith(f"({caught.value.hint})")


def test_a_python_file_named_as_a_module_found_first_is_renamed(tmp_path, runner, monkeypatch):
    """code.py (Python's own module `code`): `code:NAME` imports Python's, which the working
    directory comes after, so the name the hint gave ended in a second refusal, 'module 'code'
    has no attribute 'build''. The hint says to rename it, and the renamed file's name works."""
    import code

    source = "from torch import nn\n\ndef build():\n    return nn.Linear(2, 3)\n"
    (tmp_path / "code.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    given = runner.invoke(app, ["summary", "code.py"])
    assert given.exit_code != 0
    assert error_line(given.stderr).endswith(
        f"(a model in Python code is named module:Callable, but code:NAME would import "
        f"{code.__file__}, found first, not code.py: rename the file, such as to code_model.py, "
        "named code_model:NAME from the folder that holds it)"
    )
    # named so anyway: the same advice, where the hint was 'use package.module:Callable'
    named = runner.invoke(app, ["summary", "code:build", "-i", "2"])
    assert named.exit_code != 0
    assert error_line(named.stderr).endswith(
        f"(code is {code.__file__}, found before code.py in this folder: rename code.py, "
        "such as to code_model.py, named code_model:build)"
    )
    (tmp_path / "code.py").rename(tmp_path / "code_model.py")
    renamed = runner.invoke(app, ["summary", "code_model:build", "-i", "2", "--format", "json"])
    assert renamed.exit_code == 0, renamed.stderr
    # a module compiled into Python (sys) has no file to name
    (tmp_path / "sys.py").write_text(source)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(tmp_path / "sys.py")
    assert caught.value.hint == (
        "a model in Python code is named module:Callable, but sys:NAME would import Python's "
        "built-in module sys, found first, not sys.py: rename the file, such as to sys_model.py, "
        "named sys_model:NAME from the folder that holds it"
    )


def test_a_plain_pickle_gives_no_raw_torch_warning(tmp_path):
    """torch warns of any pickle of protocol 3+ ("Detected pickle protocol 4"): a raw warning
    on the user's terminal, and the error's reason under -W error."""
    import pickle
    import warnings

    path = tmp_path / "weights.pkl"
    path.write_bytes(pickle.dumps(_state_dict(), protocol=4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(CheckpointError) as caught:
            load_checkpoint(path)
    assert "Warning" not in caught.value.message
    assert caught.value.message.startswith(f"cannot read checkpoint {path}: it is a plain pickle")


@pytest.mark.parametrize("legacy", [False, True])
def test_load_checkpoint_truncated(tmp_path, legacy):
    whole = tmp_path / "whole.pt"
    torch.save(_state_dict(), whole, _use_new_zipfile_serialization=not legacy)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(cut)
    assert caught.value.message.startswith(f"cannot read checkpoint {cut}")
    assert caught.value.hint == "the file may be truncated or not a PyTorch checkpoint"


def test_load_checkpoint_missing_file(tmp_path):
    with pytest.raises(InputError, match="checkpoint not found"):
        load_checkpoint(tmp_path / "nope.pt")


def test_load_checkpoint_safetensors(tmp_path):
    from safetensors.torch import save_file

    state = _state_dict()
    save_file(state, str(tmp_path / "w.safetensors"))
    loaded = load_checkpoint(tmp_path / "w.safetensors")
    assert all(torch.equal(loaded[k], state[k]) for k in state)
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes((tmp_path / "w.safetensors").read_bytes()[:40])
    with pytest.raises(CheckpointError, match="cannot read safetensors file"):
        load_checkpoint(broken)


def test_save_checkpoint_is_atomic_and_loads_weights_only(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint({"format_version": 1, "model": _state_dict(), "classes": ["a"]}, path)
    assert load_checkpoint(path)["classes"] == ["a"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_strip_module_prefix():
    tensor = torch.zeros(1)
    state = {
        "module.fc.weight": tensor,
        "_orig_mod.module.conv.bias": tensor,  # torch.compile(DDP(model))
        "module._orig_mod.bn.weight": tensor,  # DDP(torch.compile(model))
        "head.module_list.0": tensor,  # "module" inside a name stays
    }
    assert list(strip_module_prefix(state)) == [
        "fc.weight",
        "conv.bias",
        "bn.weight",
        "head.module_list.0",
    ]


def test_extract_state_dict_from_the_usual_wrappers():
    state = _state_dict()
    prefixed = {f"module.{k}": v for k, v in state.items()}
    torchkit_ckpt = {"format_version": 1, "model": prefixed, "optimizer": {"lr": 0.1}}
    for wrapped in (
        state,
        prefixed,
        torchkit_ckpt,
        {"state_dict": prefixed, "epoch": 3},
        {"model_state_dict": state, "optimizer_state_dict": {}},
        {"net": state},
    ):
        assert list(extract_state_dict(wrapped)) == list(state)
    module = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    assert list(extract_state_dict(module)) == list(state)
    with pytest.raises(CheckpointError, match="its top-level keys are: epoch, lr"):
        extract_state_dict({"epoch": 1, "lr": 0.1})
    with pytest.raises(CheckpointError, match="holding a list"):
        extract_state_dict([1, 2])


def test_an_empty_checkpoint_is_said_to_be_empty_not_given_an_empty_key_list(tmp_path):
    """Before: 'cannot find model weights in the checkpoint (its top-level keys are: )' for an
    empty state dict or .safetensors file, and the same blank list from convert checkpoint."""
    with pytest.raises(CheckpointError, match="it is empty, with no keys"):
        extract_state_dict({})
    torch.save({}, tmp_path / "empty.pt")
    result = run_torchkit_in_process(
        "convert", "checkpoint", tmp_path / "empty.pt", tmp_path / "out.safetensors"
    )
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert "it is empty, with no keys" in line and "keys are: )" not in line
    assert not (tmp_path / "out.safetensors").exists()


def test_load_weights_into_explains_the_mismatch():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    state = _state_dict()
    state["2.weight"] = torch.zeros(5, 4)
    state["extra.bias"] = torch.zeros(1)
    del state["0.bias"]
    with pytest.raises(CheckpointError) as caught:
        load_weights_into(model, state, source="best.pt")
    message = caught.value.message
    assert message.startswith("the weights in best.pt do not fit the model: ")
    assert "1 shape mismatches (first: 2.weight is (5, 4) in the weights, (2, 4) in the model)" in (
        message
    )
    assert "1 missing keys (first: 0.bias)" in message
    assert "1 unexpected keys (first: extra.bias)" in message
    # the head follows the weights: --num-classes, which cannot make them fit, is not named
    assert caught.value.hint == "check the model and --image-size"
    good = _state_dict()
    load_weights_into(model, good)
    assert torch.equal(model[0].weight, good["0.weight"])
    with torch.no_grad():
        assert not math.isnan(float(model(torch.ones(1, 3)).sum()))


def test_first_line_of_an_error():
    from torchkit.core.io.errors import first_line

    error = RuntimeError("\n  mat1 and mat2 shapes cannot be multiplied  \nsecond line\n")
    assert first_line(error) == "mat1 and mat2 shapes cannot be multiplied"
    assert first_line(error, with_type=True).startswith("RuntimeError: mat1 and mat2")
    assert first_line(ValueError()) == first_line(ValueError(), with_type=True) == "ValueError"


def test_cudnn_benchmark_is_off_unless_asked_for_on_cuda_and_not_deterministic():
    from torchkit.core.train import TrainConfig
    from torchkit.core.train.setup import cudnn_benchmark_for

    assert not cudnn_benchmark_for("cuda", TrainConfig())
    assert cudnn_benchmark_for("cuda", TrainConfig(cudnn_benchmark=True))
    # A limit asks for the autotuning, unless it is turned off as well.
    assert cudnn_benchmark_for("cuda", TrainConfig(cudnn_benchmark_limit=3))
    assert not cudnn_benchmark_for(
        "cuda", TrainConfig(cudnn_benchmark_limit=3, cudnn_benchmark=False)
    )
    assert not cudnn_benchmark_for("cuda", TrainConfig(cudnn_benchmark=True, deterministic=True))
    assert not cudnn_benchmark_for("cuda", TrainConfig(cudnn_benchmark=False))
    assert not cudnn_benchmark_for("cuda", TrainConfig(deterministic=True))
    assert not cudnn_benchmark_for("cpu", TrainConfig(cudnn_benchmark=True))


def test_cudnn_benchmark_with_deterministic_is_one_usage_error(tmp_path):
    from processes import run_torchkit_in_process

    out = tmp_path / "run"
    done = run_torchkit_in_process(
        "train", "--cudnn-benchmark", "--deterministic", "--epochs", "1", "--out", out
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "--cudnn-benchmark" in errors[0] and "--deterministic" in errors[0]
    assert not out.exists()


def test_cudnn_switches_are_set_on_cuda_only_and_the_limit_when_given(monkeypatch):
    import torch

    from torchkit.core.train import TrainConfig
    from torchkit.core.train.setup import set_cudnn_switches

    cudnn = torch.backends.cudnn
    monkeypatch.setattr(cudnn, "benchmark", False)
    monkeypatch.setattr(cudnn, "benchmark_limit", 10)
    set_cudnn_switches("cpu", TrainConfig(cudnn_benchmark_limit=2))
    assert (cudnn.benchmark, cudnn.benchmark_limit) == (False, 10)
    monkeypatch.setattr(cudnn, "benchmark", True)
    set_cudnn_switches("cuda", TrainConfig())
    assert (cudnn.benchmark, cudnn.benchmark_limit) == (False, 10)  # off by default: set
    set_cudnn_switches("cuda", TrainConfig(cudnn_benchmark=True))
    assert (cudnn.benchmark, cudnn.benchmark_limit) == (True, 10)  # torch's default kept
    # With the autotuning off the limit means nothing (a resumed run may keep one): unset.
    set_cudnn_switches("cuda", TrainConfig(cudnn_benchmark_limit=2, cudnn_benchmark=False))
    assert (cudnn.benchmark, cudnn.benchmark_limit) == (False, 10)
    set_cudnn_switches("cuda", TrainConfig(cudnn_benchmark_limit=2))
    assert (cudnn.benchmark, cudnn.benchmark_limit) == (True, 2)


def test_a_negative_cudnn_benchmark_limit_is_one_usage_error(tmp_path):
    from processes import run_torchkit_in_process

    out = tmp_path / "run"
    done = run_torchkit_in_process("train", "--cudnn-benchmark-limit", "-1", "--out", out)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert errors == ["Error: --cudnn-benchmark-limit must not be negative, not -1"]
    assert not out.exists()


def test_a_run_puts_torchs_cudnn_switches_back(monkeypatch, tmp_path):
    """The runner restores torch's global cuDNN switches, the autotuning limit included."""
    import torch

    from torchkit.core.train import TrainConfig, run_training
    from torchkit.core.train import setup as train_setup

    cudnn = torch.backends.cudnn
    monkeypatch.setattr(cudnn, "benchmark_limit", 7)
    real = train_setup.set_cudnn_switches

    def as_on_cuda(device_type, config):  # what a CUDA run sets, on this CPU run
        real("cuda", config)
        assert cudnn.benchmark_limit == 3

    monkeypatch.setattr(train_setup, "set_cudnn_switches", as_on_cuda)
    run_training(  # digits in three batches of 512, at 8 px, in this process: a short run
        TrainConfig(
            out=str(tmp_path / "run"),
            device="cpu",
            epochs=1,
            cudnn_benchmark_limit=3,
            batch_size=512,
            image_size=8,
            workers=0,
        )
    )
    assert cudnn.benchmark_limit == 7


def test_lists_in_error_lines_name_the_first_few_and_count_the_rest():
    assert first_and_more(["a", "b"], 3) == "a, b"
    assert first_and_more(["a", "b", "c"], 3) == "a, b, c"
    assert first_and_more(["a", "b", "c", "d", "e"], 3) == "a, b, c and 2 more"
