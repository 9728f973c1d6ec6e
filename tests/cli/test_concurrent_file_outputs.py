"""A file output (`-o FILE`, DST) that another process writes while the command runs: the command
replaces only what its checks found at that name, never the other process's file."""

from __future__ import annotations

import errno
import os
import textwrap

import pytest
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.io.errors import OutputExistsError
from torchkit.core.io.file_outputs import check_output_file
from torchkit.core.io.files import atomic_path, atomic_write_text

# A model whose forward writes the file `rival.csv` once, as a second command given the same
# `-o` would while this one predicts.
RIVAL_MODULE = textwrap.dedent(
    """
    import os
    import torch

    class RivalNet(torch.nn.Module):
        def __init__(self, num_classes=2):
            super().__init__()
            self.head = torch.nn.Linear(3, num_classes)

        def forward(self, x):
            if not os.path.exists("rival.csv"):
                with open("rival.csv", "w") as handle:
                    handle.write("the other command's rows\\n")
            return self.head(x.mean(dim=(2, 3)))
    """
)


def test_predict_o_never_replaces_a_file_another_command_wrote_meanwhile(tmp_path, image_folder):
    (tmp_path / "rival_net.py").write_text(RIVAL_MODULE)
    result = run_torchkit_in_process(
        "predict", "rival_net:RivalNet", image_folder, "--allow-untrained", "--device", "cpu",
        "--format", "csv", "-o", "rival.csv", "-j", "0", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    line = error_line(result.stderr)
    assert "output rival.csv was written by another process while this command ran" in line
    assert "this command's output is at rival.csv.new" in line
    assert (tmp_path / "rival.csv").read_text() == "the other command's rows\n"
    assert (tmp_path / "rival.csv.new").read_text().startswith("path,")


@pytest.mark.parametrize("force", [False, True])
def test_a_checked_file_output_replaces_only_what_the_check_found(tmp_path, force):
    target = tmp_path / "report.json"
    if force:
        target.write_text("the old report\n")
    check_output_file(target, force)
    (tmp_path / "other.json").write_text("another command's report\n")
    (tmp_path / "other.json").rename(target)  # written at that name meanwhile
    target.with_name("report.json.new").write_text("an earlier .new\n")
    with pytest.raises(OutputExistsError) as raised:
        atomic_write_text(target, "this command's report\n")
    assert "this command's output is at " + str(target) + ".new-2" in raised.value.message
    assert target.read_text() == "another command's report\n"
    assert target.with_name("report.json.new-2").read_text() == "this command's report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "report.json",
        "report.json.new",
        "report.json.new-2",
    ]


def test_a_checked_file_output_is_written_when_nothing_changed_and_then_again(tmp_path):
    target = tmp_path / "model.pt"
    target.write_bytes(b"old")
    check_output_file(target, True)
    with atomic_path(target) as temporary:
        temporary.write_bytes(b"new")
    assert target.read_bytes() == b"new"
    atomic_write_text(target, "again")  # the check was for one write: a later one replaces
    assert target.read_text() == "again"


def test_without_hard_links_a_new_file_output_is_renamed_into_place_unless_one_came(
    tmp_path, monkeypatch
):
    def no_hard_links(*args, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")  # vfat, some FUSE file systems

    monkeypatch.setattr(os, "link", no_hard_links)
    first, second = tmp_path / "first.csv", tmp_path / "second.csv"
    check_output_file(first, False)
    atomic_write_text(first, "rows\n")
    assert first.read_text() == "rows\n"
    check_output_file(second, False)
    second.write_text("another command's rows\n")
    with pytest.raises(OutputExistsError, match="written by another process"):
        atomic_write_text(second, "rows\n")
    assert second.read_text() == "another command's rows\n"
    assert (tmp_path / "second.csv.new").read_text() == "rows\n"
    assert sorted(os.listdir(tmp_path)) == ["first.csv", "second.csv", "second.csv.new"]
