"""The commands that errors, warnings and notes show carry paths as shell words a user can
paste: a plain path as it is (`--weights net.pt`), one with a space or a shell character in
quotes (`--weights 'my runs/net.pt'`), one with a line break or a byte that is not UTF-8 in
ANSI-C quotes (`$'a\\nb'`), which keeps the hint on its one line."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from image_folders import write_image_folder
from processes import run_torchkit_in_process

from torchkit.core.io.shell_words import shell_line, shell_word


@pytest.mark.parametrize(
    ("text", "word"),
    [
        ("net.pt", "net.pt"),
        ("runs/a-1/best.pt", "runs/a-1/best.pt"),
        ("my runs/net.pt", "'my runs/net.pt'"),
        ("a'b", "'a'\"'\"'b'"),
        ("$HOME/net.pt", "'$HOME/net.pt'"),
        ("", "''"),
        ("a\nb", "$'a\\nb'"),
        ("a\tb\\c'd", "$'a\\tb\\\\c\\'d'"),
        ("x\x1b[31m", "$'x\\x1b[31m'"),
        ("\udcff.pt", "$'\\xff.pt'"),
        ("\x85", "$'\\u0085'"),
    ],
)
def test_a_value_is_one_shell_word(text, word):
    assert shell_word(text) == word
    if text:  # (Path("") is ".")
        assert shell_word(Path(text)) == word


def test_a_command_line_is_its_words_each_quoted_as_needed():
    assert shell_line(["torchkit", "train", "--resume", Path("my run")]) == (
        "torchkit train --resume 'my run'"
    )


def test_plain_weights_named_with_a_space_show_the_quoted_weights_to_give(tmp_path):
    torch.save(torch.nn.Linear(2, 2).state_dict(), tmp_path / "my ck.pt")
    result = run_torchkit_in_process("summary", "my ck.pt", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "Error: my ck.pt holds plain weights (a state dict), not the architecture they belong "
        "to (name the architecture they belong to: MODEL --weights 'my ck.pt')"
    )


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (
            "train",
            "to fine-tune the EMA weights, keep them alone with `torchkit convert checkpoint "
            "'my ck.pth.tar' EMA.pt --key state_dict_ema` and pass EMA.pt as --weights",
        ),
        (
            "summary",
            "`torchkit convert checkpoint 'my ck.pth.tar' EMA.pt --key state_dict_ema` keeps "
            "those alone",
        ),
    ],
)
def test_the_note_of_a_checkpoints_ema_weights_quotes_its_path(command, said):
    from torchkit.core.models.resolver import _weights_used

    loaded = {"state_dict": {}, "state_dict_ema": {}}
    note = _weights_used("my ck.pth.tar", loaded, "state_dict_ema", False, command)
    assert note == (
        "my ck.pth.tar holds the model's weights (state_dict) and their EMA (state_dict_ema): "
        f"loaded state_dict; {said}"
    )


def test_the_warning_of_copies_across_splits_quotes_the_data_to_look_at(tmp_path, caplog):
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.loaders import load_splits

    root = tmp_path / "my data"
    write_image_folder(root / "train", {"ant": 2, "bee": 2}, seed=1)
    write_image_folder(root / "val", {"ant": 1, "bee": 1}, seed=2)
    (root / "val" / "ant" / "leak.png").write_bytes((root / "train/ant/ant_0.png").read_bytes())
    with caplog.at_level(logging.WARNING, logger="torchkit"):
        load_splits(TrainConfig(data=str(root)))
    (line,) = [r.getMessage() for r in caplog.records if "byte-identical" in r.getMessage()]
    assert line.endswith(
        f"see them with `torchkit dataset-stats '{root}'` (`torchkit split` keeps copies in "
        "one split)"
    )


def test_the_command_that_resumes_a_stopped_run_keeps_a_line_break_on_its_line():
    from torchkit.cli.train import _resume_command

    stopped = SimpleNamespace(out_dir=Path("runs/a\nb"), model="convnet")
    assert _resume_command(stopped) == "torchkit train --resume $'runs/a\\nb'"
