"""predict names a model's outputs by the class folders of a folder it reads whole (images
beside them) from the one listing that read its images, as eval reads them: linked class
folders too (such a folder was listed a second time, by the reader of labels)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from torchkit.core.data.sources import discovery, open_data
from torchkit.core.predict.inputs import class_folder_names


def image(path: Path, shade: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4), (shade, 0, 0)).save(path)


def lay_out(root: Path, elsewhere: Path, case: str) -> None:
    image(root / "top.png", 1)  # beside the class folders: predict reads the folder whole
    image(root / "a" / "x.png", 2)
    image(root / "b" / "y.png", 3)
    image(elsewhere / "cc" / "z.png", 4)
    if case == "link to a class":  # a and c: one file in two classes, which eval refuses
        (root / "c").symlink_to("a")
    elif case == "link to an empty folder in a class":
        (root / "a" / "empty").mkdir()
        (root / "c").symlink_to("a/empty")
    elif case == "link elsewhere":
        (root / "c").symlink_to(elsewhere / "cc")
    elif case == "links below the classes":
        (root / "a" / "more").symlink_to(elsewhere / "cc")
        (root / "b" / "back").symlink_to("../a")
    elif case == "two links to one folder":  # c and d: one file in two classes
        (root / "c").symlink_to(elsewhere / "cc")
        (root / "d").symlink_to(elsewhere / "cc")


CASES = [
    "link to a class",
    "link to an empty folder in a class",
    "link elsewhere",
    "links below the classes",
    "two links to one folder",
]


@pytest.mark.parametrize("case", CASES)
def test_linked_class_folders_name_the_outputs_as_eval_reads_them_from_one_listing(
    tmp_path, monkeypatch, case
):
    root, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    lay_out(root, elsewhere, case)
    listings = []
    listed = discovery.list_folders

    def counted(tops, **options):
        listings.append([str(top) for top in tops])
        return listed(tops, **options)

    monkeypatch.setattr(discovery, "list_folders", counted)
    source = open_data(str(root), allow_unlabelled=True, every_image=True)
    assert listings == [[str(root)]]
    by_labels = class_folder_names(str(root))  # the reader of labels, listing it again
    expected = {
        "link to a class": [""],
        "link to an empty folder in a class": ["a", "b", "c"],
        "link elsewhere": ["a", "b", "c"],
        "links below the classes": ["a", "b"],
        "two links to one folder": [""],
    }[case]
    assert by_labels == expected
    if case == "two links to one folder":  # c's target is d's, elsewhere: listed again
        assert source.labelled_classes is None
    else:
        assert source.labelled_classes == expected


def test_predict_names_outputs_by_linked_class_folders_without_listing_again(
    tmp_path, monkeypatch, runner
):
    import torch

    from torchkit.cli import app
    from torchkit.core.models.convnet import convnet_class
    from torchkit.core.predict import inputs

    root, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    lay_out(root, elsewhere, "link elsewhere")
    weights = tmp_path / "sd.pt"
    torch.save(convnet_class()(3, 3, 8).state_dict(), weights)
    again = []
    monkeypatch.setattr(inputs, "class_folder_names", lambda item: again.append(item) or [""])
    args = ["predict", "convnet", "--weights", str(weights), str(root), "--image-size", "8"]
    result = runner.invoke(app, [*args, "--device", "cpu", "-j", "0", "--format", "csv"])
    assert result.exit_code == 0, result.stderr
    assert again == []
    assert "named by the classes of" in result.stderr
    rows = result.stdout.splitlines()[1:]
    assert [row.split(",")[0] for row in rows] == ["a/x.png", "b/y.png", "c/z.png", "top.png"]
    assert all(row.split(",")[2] in ("a", "b", "c") for row in rows)
