"""`-o FILE` picks the printed result's format from its extension (.json, .csv) when --format is
not given, in every command; a --format that contradicts the name is a usage error before any
work; a bad choice is click's plain line."""

from __future__ import annotations

import csv
import json

import pytest
from output_checks import error_line
from processes import run_torchkit_in_process

# Every command that prints a result: the contradiction is refused before the inputs (which do
# not exist here) are even looked at.
COMMANDS = [
    ["env"],
    ["convert", "tensor", "nope.png", "out.npy"],
    ["convert", "cifar", "nope", "out"],
    ["convert", "checkpoint", "a.pt", "b.pt"],
    ["convert", "checkpoint", "--average", "a.pt", "b.pt", "avg.pt"],
    ["dataset-stats", "nope"],
    ["split", "nope", "out"],
    ["summary", "convnet"],
    ["train", "--data", "nope"],
    ["eval", "convnet", "--data", "nope"],
    ["predict", "convnet", "nope"],
    ["export", "convnet", "out.onnx"],
    ["benchmark", "convnet"],
    ["benchmark", "convnet", "--append"],
    ["extract-features", "convnet", "--list-layers"],
    ["video-info", "nope.mp4"],
    ["convert-syncbn", "nope.pt"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_format_contradicting_the_output_name_is_a_usage_error_before_any_work(command, tmp_path):
    done = run_torchkit_in_process(*command, "-o", "report.json", "--format", "csv", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert error_line(done.stderr, besides="nothing") == (
        "Error: --format csv, but -o report.json names a JSON file (drop --format: the "
        "extension picks the format; or give -o another name)"
    )
    assert list(tmp_path.iterdir()) == []


def test_output_name_picks_the_format(image_folder, tmp_path):
    stats = tmp_path / "st.json"
    done = run_torchkit_in_process("dataset-stats", image_folder, "-j", "0", "-o", stats)
    assert done.returncode == 0, done.stderr
    data = json.loads(stats.read_text())
    assert len(data["mean"]) == len(data["std"]) == 3
    # ... which train reads as it is.
    config = run_torchkit_in_process("train", "--stats", stats, "--print-config")
    assert config.returncode == 0, config.stderr
    assert json.loads(config.stdout)["mean"] == pytest.approx(data["mean"])

    upper = tmp_path / "st.CSV"  # the extension in any case
    done = run_torchkit_in_process("dataset-stats", image_folder, "-j", "0", "-o", upper)
    assert done.returncode == 0, done.stderr
    assert next(csv.reader(upper.open())) == ["section", "name", "value"]

    # Any other name, and stdout, get the table; --format table with a .txt name is no
    # contradiction, and --format still picks the format of any other name.
    for name, fmt in (("st.txt", []), ("table.txt", ["--format", "table"])):
        done = run_torchkit_in_process(
            "dataset-stats", image_folder, "-j", "0", "-o", tmp_path / name, *fmt
        )
        assert done.returncode == 0, done.stderr
        assert "statistic" in (tmp_path / name).read_text()
    done = run_torchkit_in_process(
        "dataset-stats", image_folder, "-j", "0", "-o", tmp_path / "st.log", "--format", "json"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "st.log").read_text())["mean"] == data["mean"]
    done = run_torchkit_in_process("dataset-stats", image_folder, "-j", "0", "-o", "-")
    assert done.returncode == 0, done.stderr
    assert "statistic" in done.stdout


def test_predict_output_name_picks_jsonl(image_folder, tmp_path):
    rows = tmp_path / "rows.jsonl"
    done = run_torchkit_in_process(
        "predict", "convnet", image_folder, "--allow-untrained", "--device", "cpu", "-j", "0",
        "-o", rows,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = rows.read_text().splitlines()
    assert len(lines) == 5 and all(json.loads(line)["path"] for line in lines)


FAST_BENCHMARK = ["benchmark", "convnet", "-i", "1,28,28", "-b", "1", "--device", "cpu"]
FAST_BENCHMARK += ["--warmup", "0", "--iters", "1"]


def test_benchmark_output_name_picks_csv_and_append_writes_csv_only(tmp_path):
    plain = tmp_path / "b.csv"
    done = run_torchkit_in_process(*FAST_BENCHMARK, "-o", plain)
    assert done.returncode == 0, done.stderr
    assert next(csv.reader(plain.open()))[:3] == ["model", "mode", "batch_size"]

    # --append adds CSV rows whatever the name, unless the name or --format says otherwise.
    log = tmp_path / "b.log"
    done = run_torchkit_in_process(*FAST_BENCHMARK, "-o", log, "--append")
    assert done.returncode == 0, done.stderr
    assert next(csv.reader(log.open()))[:3] == ["model", "mode", "batch_size"]
    refused = run_torchkit_in_process(*FAST_BENCHMARK, "-o", tmp_path / "b.json", "--append")
    assert refused.returncode == 2
    assert error_line(refused.stderr, besides="nothing") == (
        "Error: --append writes CSV, not json (give -o a .csv name)"
    )
    assert not (tmp_path / "b.json").exists()


def test_print_config_writes_json_only(tmp_path):
    refused = run_torchkit_in_process("train", "--print-config", "-o", tmp_path / "c.csv")
    assert refused.returncode == 2
    assert error_line(refused.stderr, besides="nothing") == (
        "Error: --print-config writes JSON, not csv (give -o a .json name)"
    )
    done = run_torchkit_in_process("train", "--print-config", "-o", tmp_path / "c.json")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "c.json").read_text())["epochs"] > 0


@pytest.mark.parametrize(
    ("command", "option", "value", "choices"),
    [
        (["env"], "--format", "yaml", "'table', 'csv', 'json'"),
        (["train"], "--format", "yaml", "'table', 'csv', 'json'"),
        (
            ["predict", "convnet", "x"],
            "--format",
            "yaml",
            "'table', 'csv', 'json', 'jsonl', 'parquet'",
        ),
        (["extract-features", "convnet"], "--format", "yaml", "'table', 'csv', 'json'"),
        (
            ["split", "x", "y"],
            "--mode",
            "fast",
            "'copy', 'symlink', 'hardlink', 'move', 'manifest'",
        ),
    ],
)
def test_a_bad_choice_is_one_plain_line(command, option, value, choices):
    done = run_torchkit_in_process(*command, option, value)
    assert done.returncode == 2
    name = " ".join(command[:1])
    assert error_line(done.stderr, besides="nothing") == (
        f"Error: Invalid value for '{option}': '{value}' is not one of {choices} "
        f"(see 'torchkit {name} --help')"
    )


@pytest.mark.parametrize(
    "words",
    [["env", "--format"], ["convert", "tensor", "--to"], ["train", "-o"]],
)
def test_an_option_without_its_value_names_the_commands_help(words):
    """The parser's own error named `torchkit --help`, where a bad value names the command's."""
    done = run_torchkit_in_process(*words)
    assert done.returncode == 2
    line = error_line(done.stderr, besides="nothing")
    assert line.endswith(f"(see 'torchkit {' '.join(w for w in words if w[0] != '-')} --help')")


@pytest.mark.parametrize(
    "command",
    [
        ["split", "{images}", "{tmp}/out", "--mode", "manifest"],
        ["video-info", "{images}/a/a_0.png", "--skip-errors"],
    ],
)
def test_dash_o_dash_is_stdout_for_split_and_video_info(image_folder, tmp_path, command):
    """Was refused as a made output ("output cannot go to standard output: '-' is stdout only
    for -o", exit 2) where the report goes through the command's own -o check."""
    args = [a.format(images=image_folder, tmp=tmp_path) for a in command]
    done = run_torchkit_in_process(*args, "-o", "-", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)


@pytest.mark.parametrize("spelled", ["./-", "--output=./-", ".//-"])
def test_dash_o_dot_slash_dash_is_a_file_called_dash(image_folder, tmp_path, spelled):
    """`-o -` is stdout; `-o ./-` is the file `-` in the working folder (a Path drops the `./`,
    which made it stdout too)."""
    option = [spelled] if spelled.startswith("--") else ["-o", spelled]
    done = run_torchkit_in_process("dataset-stats", image_folder, "-j", "0", *option, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and "statistic" in (tmp_path / "-").read_text()
    split = run_torchkit_in_process(
        "split", image_folder, tmp_path / "out", "--mode", "manifest", *option, "--force",
        cwd=tmp_path,
    )  # fmt: skip
    assert split.returncode == 0, split.stderr
    assert split.stdout == "" and "train" in (tmp_path / "-").read_text()


def test_every_dash_o_keeps_dot_slash_dash_a_file():
    """Each command's -o (its own or the shared option) reads `./-` as the file `-` here."""
    import os
    from pathlib import Path

    import typer.main

    from torchkit.cli import app

    def commands(command, ctx, path=()):
        if hasattr(command, "list_commands"):  # a group (of Typer's own click)
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                yield from commands(sub, sub.context_class(sub, parent=ctx), (*path, name))
        else:
            yield path, command, ctx

    root = typer.main.get_command(app)
    seen = []
    for path, command, ctx in commands(root, root.context_class(root)):
        for param in command.params:
            if "-o" in param.opts:
                assert param.process_value(ctx, "./-") == Path(os.getcwd(), "-"), path
                assert str(param.process_value(ctx, "-")) == "-", path
                seen.append(" ".join(path))
    assert len(seen) >= 12 and "train" in seen and "predict" in seen, seen


def test_rates_read_the_same_in_every_table_and_message():
    """One formatter for images/s (eval's table, train's, benchmark's, the progress lines,
    predict's, convert's and extract-features' notes): eval's showed 3739 beside train's 4,196,
    extract-features' 3739.4."""
    from torchkit.cli.render import format_rate

    shown = [format_rate(v) for v in (3739.4, 1_234_567.8, 99.96, 12.345, 0.5123, 0, 5)]
    assert shown == ["3,739", "1,234,568", "100", "12.3", "0.512", "0", "5.00"]
    assert [format_rate(v) for v in (None, float("nan"), float("inf"))] == ["", "", ""]


@pytest.mark.parametrize(
    "value, shown",
    [
        (999, "999"),
        (1_000, "1.00 k"),
        (999_994, "999.99 k"),
        (999_995, "1.00 M"),  # 999.995 k rounds to 1000.00: it is 1.00 M
        (999_999, "1.00 M"),
        (999_995_000, "1.00 G"),
        (4_360_000_000, "4.36 G"),
        (999_999_999_999, "1.00 T"),
        (-999_999, "-1.00 M"),
    ],
)
def test_counts_with_a_prefix_read_below_a_thousand_of_it(value, shown):
    """summary's totals and benchmark's per-image counts: a count a hair under a million read
    "1000.00 k" (and under a billion "1000.00 M"), where the next prefix says 1.00."""
    from torchkit.cli.render import readable_number

    assert readable_number(value) == shown
    assert readable_number(value, "FLOPs").startswith(shown)


@pytest.mark.parametrize(
    "size, shown",
    [
        (0, "0 B"),
        (1_023, "1023 B"),
        (1_024, "1.0 KiB"),
        (1_048_524, "1023.9 KiB"),
        (1_048_575, "1.0 MiB"),  # 1023.999 KiB rounds to 1024.0: it is 1.0 MiB
        (2**30 - 1, "1.0 GiB"),
        (3 * 2**50, "3072.0 TiB"),
    ],
)
def test_sizes_in_binary_units_read_below_1024_of_a_unit(size, shown):
    """dataset-stats' total size and video-info's size column."""
    from torchkit.cli.render import binary_size

    assert binary_size(size) == shown


@pytest.mark.parametrize(
    "value, shown",
    [
        (0.0, "0.0000"),
        (0.12345, "0.1235"),
        (6.2e-6, "0.00000620"),  # 4 decimals showed 0.0000
        (-4e-5, "-0.0000400"),
        (5e-5, "0.0001"),
        (1e-300, "1e-300"),
    ],
)
def test_a_small_number_in_a_table_is_not_shown_as_zero(value, shown):
    """eval's and train's losses, and every other float a table shows."""
    from torchkit.cli.render import format_cell

    assert format_cell(value) == shown
