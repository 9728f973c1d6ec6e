"""dataset-stats' refusals of its options and of `digits`: each hint, one flat line with no
brackets of its own, says what to give instead."""

from __future__ import annotations

import pytest
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.io.errors import UsageError


def test_a_near_threshold_out_of_range_names_the_default():
    """The command line's own range stops `--near-threshold 99` first; a caller of core gets
    this."""
    from torchkit.core.stats.run import DEFAULT_NEAR_THRESHOLD, MAX_THRESHOLD, check_near_threshold

    with pytest.raises(UsageError) as caught:
        check_near_threshold(MAX_THRESHOLD + 1)
    assert str(caught.value) == (
        f"--near-threshold must be between 0 and {MAX_THRESHOLD} bits, not {MAX_THRESHOLD + 1} "
        f"(the default, {DEFAULT_NEAR_THRESHOLD}, finds re-encoded and resized copies)"
    )


def test_a_leakage_csv_of_data_without_splits_says_what_data_to_give(tmp_path):
    data = write_image_folder(tmp_path / "data", {"a": 1, "b": 1})
    result = run_torchkit_in_process(
        "dataset-stats", data, "-j", "0", "--leakage-csv", tmp_path / "pairs.csv"
    )
    assert result.returncode == 2
    assert error_line(result.stderr) == (
        f"Error: --leakage-csv: {data} has no splits to compare (give split data, such as a "
        "split root or a CSV with a split column, or add --near-duplicates to list near "
        "duplicates within a split)"
    )
    assert not (tmp_path / "pairs.csv").exists()


def test_digits_is_refused_with_the_path_of_a_folder_named_so(tmp_path):
    result = run_torchkit_in_process("dataset-stats", "digits", cwd=tmp_path)
    assert result.returncode == 1
    assert error_line(result.stderr, besides="nothing") == (
        "Error: dataset-stats reads image files, and `digits` is built in (give an image folder, "
        "a split root or a CSV index; ./digits for a folder named so)"
    )
