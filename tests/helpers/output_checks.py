"""Checks of what a command leaves behind and says: the one `Error:` line of stderr, a hash of a
folder tree, a refusal that touched nothing, the hidden files beside an output (the output-safety
tests, issue #13)."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from processes import run_torchkit_in_process


def torchkit_log_to_caplog(caplog, monkeypatch) -> None:  # noqa: ANN001 (pytest fixtures)
    """Let `caplog` see each record of the `torchkit` logger once. The CLI makes that logger
    non-propagating (it has its own stderr handler), and pytest adds caplog's handler to the
    loggers that do not propagate when a test starts (an earlier command run in the same
    process made it so): there propagating too gave caplog each record twice; else the records
    reach caplog through the root logger only where the logger propagates."""
    logger = logging.getLogger("torchkit")
    if caplog.handler not in logger.handlers:
        monkeypatch.setattr(logger, "propagate", True)


def tree_digest(root: Path, *, folders: bool = True) -> dict[str, str]:
    """Every entry under `root`, hidden ones too: relative path -> SHA-256 of a file's bytes,
    `-> TARGET` for a symbolic link (never followed), `dir` for a folder (left out with
    `folders=False`), the file type of anything else (a FIFO is never opened)."""
    found: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            relative = path.relative_to(root).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                found[relative] = "-> " + os.readlink(path)
            elif stat.S_ISREG(mode):
                found[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
            elif stat.S_ISDIR(mode):
                if folders:
                    found[relative] = "dir"
            else:
                found[relative] = f"file type {stat.S_IFMT(mode):o}"
    return found


def check_refused_untouched(args: Sequence[str], message: str, *, cwd: Path) -> None:
    """`torchkit ARGS` in `cwd` exits 1 with nothing on stdout and one `Error:` line (warnings
    aside) holding `message`, and no entry under `cwd` changed or appeared."""
    before = tree_digest(cwd)
    done = run_torchkit_in_process(*args, cwd=cwd)
    assert done.returncode == 1, done.stderr
    assert message in error_line(done.stderr, besides="warnings")
    assert done.stdout == ""
    assert tree_digest(cwd) == before  # no byte changed, nothing written, no lock or temporary


def hidden_siblings(folder: Path) -> list[str]:
    """What torchkit keeps beside `folder` while it writes it (`.NAME.*`: the lock, a set-aside
    old output, a partial new one): none of it may remain once a command has ended."""
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


def error_line(stderr: str, *, besides: str = "anything") -> str:
    """The one `Error: ` line of `stderr`, which must be its last line, with no traceback;
    `besides` is what the lines before it may be: "anything", "warnings" or "nothing"."""
    lines = stderr.splitlines()
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].startswith("Error: "), stderr
    assert lines[-1] == errors[0], stderr
    assert "Traceback" not in stderr, stderr
    if besides == "warnings":
        assert all(line.startswith("Warning:") for line in lines[:-1]), stderr
    elif besides == "nothing":
        assert lines == errors, stderr
    else:
        assert besides == "anything", besides
    return errors[0]


def write_command_inputs(root: Path, per_class: int) -> Path:
    """What the commands of the output-path tests read, under ROOT: `images/` (classes a and b,
    PER_CLASS 12 px images each), `weights.pt` (a state dict) and `model.pt` (a torchkit
    checkpoint of the convnet for those images)."""
    import torch
    from image_folders import write_image_folder

    from torchkit.core.models.convnet import convnet_class

    write_image_folder(root / "images", {"a": per_class, "b": per_class}, size=12)
    torch.save({"w": torch.ones(2, 2)}, root / "weights.pt")
    model = convnet_class()(2, 3, 12)
    checkpoint = {"format_version": 1, "arch": "convnet", "num_classes": 2, "classes": ["a", "b"]}
    checkpoint["model"] = model.state_dict()
    checkpoint["preprocess"] = {"image_size": 12, "in_channels": 3}
    torch.save(checkpoint, root / "model.pt")
    return root
