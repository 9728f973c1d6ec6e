"""A folder on disk of flat images beside KEY.txt captions (a captioning data set): train and
eval asked only for class folders; they name the .txt files as captions, not class labels, as
for a .tar of such a folder."""

from __future__ import annotations

from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process


def test_train_names_the_txt_files_beside_flat_images_as_captions(tmp_path):
    folder = tmp_path / "captions"
    write_image_folder(tmp_path / "images", {"a": 2})
    folder.mkdir()
    for number, image in enumerate(sorted((tmp_path / "images" / "a").iterdir())):
        image.rename(folder / f"{number:03d}{image.suffix}")
        (folder / f"{number:03d}.txt").write_text("a photo")
    result = run_torchkit_in_process(
        "train", "--data", folder, "--model", "tiny_convnet", "--out", tmp_path / "run"
    )
    assert result.returncode != 0
    line = error_line(result.stderr)
    assert "its KEY.txt files (000.txt and 1 more) are captions, not class labels" in line, line
    assert not (tmp_path / "run").exists()
