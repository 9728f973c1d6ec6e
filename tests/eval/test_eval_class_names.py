"""eval and predict when `--classes` or the data name classes otherwise than the model: names
the model records are never moved to another output, and an unknown class is shown as spelled."""

from __future__ import annotations

import json
import unicodedata

import pytest
from checkpoints import write_convnet_checkpoint
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.io.errors import UsageError

CAFE = unicodedata.normalize("NFC", "café")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("class_names")
    checkpoint = root / "ck.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=8, classes="abcd")
    write_image_folder(root / "imgs", {"a": 1, "b": 1})
    return {"checkpoint": checkpoint, "root": root}


def _command(world, command: str, classes: str) -> list[object]:
    if command == "eval":
        return ["eval", world["checkpoint"], "--data", world["root"] / "imgs", "--classes", classes]
    return ["predict", world["checkpoint"], world["root"] / "imgs", "--classes", classes]


@pytest.mark.parametrize("command", ["eval", "predict"])
@pytest.mark.parametrize(
    "classes, moved",
    [("d,c,b,a", "'d' as output 0, but {ck} names it as output 3"),
     ("b,a,x,y", "'b' as output 0, but {ck} names it as output 1")],
)  # fmt: skip
def test_classes_the_checkpoint_names_at_other_outputs_are_refused(world, command, classes, moved):
    """Renaming output 0 (trained as `a`) to `d` scored every image against the wrong class."""
    result = run_torchkit_in_process(*_command(world, command, classes), "-j", "0")
    assert result.returncode == 2 and result.stdout == ""
    line = error_line(result.stderr)
    assert f"--classes names {moved.format(ck=world['checkpoint'])}" in line
    assert "in its order: a, b, c, d" in line


def test_classes_in_the_checkpoints_order_or_new_names_are_taken(world):
    for classes in ("a,b,c,d", "a,x,c,y"):
        result = run_torchkit_in_process(
            *_command(world, "predict", classes), "-j", "0", "--format", "json"
        )
        assert result.returncode == 0, result.stderr
        names = classes.split(",")
        for row in json.loads(result.stdout):
            assert row["class"] == names[row["class_index"]]


def test_a_class_in_another_unicode_spelling_is_the_same_class(tmp_path):
    checkpoint = tmp_path / "ck.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=8, classes="ab")
    from torchkit.core.models.checkpoint import load_checkpoint, save_checkpoint

    saved = load_checkpoint(checkpoint)
    saved["classes"] = [CAFE, "tea"]
    save_checkpoint(saved, checkpoint)
    write_image_folder(tmp_path / "imgs", {"tea": 1})
    nfd = unicodedata.normalize("NFD", CAFE)
    result = run_torchkit_in_process(
        "predict", checkpoint, tmp_path / "imgs", "--classes", f"x,{nfd}", "-j", "0"
    )
    assert result.returncode == 2
    assert f"as output 1, but {checkpoint} names it as output 0" in result.stderr


def test_an_unknown_class_with_spaces_around_it_is_quoted(world, tmp_path):
    """A folder `a ` against the model's `a` read "class(es) a  of ... (the classes are: a...)"."""
    write_image_folder(tmp_path / "imgs", {"a ": 1, "b": 1})
    result = run_torchkit_in_process("eval", world["checkpoint"], "--data", tmp_path / "imgs")
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert "class(es) 'a ' of " in line and "(the classes are: a, b, c, d)" in line


def test_a_classes_file_saved_with_a_bom_names_its_first_class_without_it(tmp_path):
    """Notepad's "UTF-8" classes.txt: the first class was `\\ufeffa`, so folder `a` was "not
    among the model's classes (the classes are: a, b...)" and predict printed `\\ufeffa`."""
    from torchkit.core.evaluate import parse_class_names

    names = tmp_path / "classes.txt"
    names.write_bytes(b"\xef\xbb\xbfa\r\nb\r\nc \r\nd\r\n \r\n\r\n")
    assert parse_class_names(str(names)) == ["a", "b", "c", "d"]


def test_a_blank_line_between_class_names_is_an_error_naming_the_line(world, tmp_path):
    """Label i is line i of --classes: a blank line between names was skipped, so every later
    name moved to the output before it (c named output 2, trained as d) without a word."""
    from torchkit.core.evaluate import parse_class_names
    from torchkit.core.io.errors import InputError

    names = tmp_path / "classes.txt"
    names.write_text("\n\na\nb\n\t\nc\nd\n\n")
    with pytest.raises(InputError, match=rf"^line 5 of --classes file {names} is blank, between"):
        parse_class_names(str(names))
    names.write_text("\n\na\nb\nc\nd\n  \n\n")  # blank lines before and after: no names
    assert parse_class_names(str(names)) == ["a", "b", "c", "d"]
    names.write_text("a\nb\n\nc\n")
    for command in ("eval", "predict"):
        result = run_torchkit_in_process(*_command(world, command, str(names)), "-j", "0")
        assert result.returncode == 1 and result.stdout == ""
        assert error_line(result.stderr, besides="nothing") == (
            f"Error: line 3 of --classes file {names} is blank, between class names (class "
            "names are read one a line, in order: a blank line would shift every later one; "
            "remove it, or fill it in)"
        )


def test_a_json_classes_file_is_read_as_json(world, tmp_path):
    """`--classes names.json` was read one name a line: a list written over four lines named
    the outputs `["a",`, `"x",` ... without a word. It is read as classes.json beside shards
    is: a list in label order, or {name: index}."""
    from torchkit.core.evaluate import parse_class_names
    from torchkit.core.io.errors import InputError

    names = tmp_path / "names.json"
    names.write_text('["a",\n "x",\n "c",\n "y"]\n')
    result = run_torchkit_in_process(
        *_command(world, "predict", str(names)), "-j", "0", "--format", "json"
    )
    assert result.returncode == 0, result.stderr
    for row in json.loads(result.stdout):
        assert row["class"] == ["a", "x", "c", "y"][row["class_index"]]
    names.write_text('{"x": 1, "a": 0, "c": 2, "y": 3}')
    assert parse_class_names(str(names)) == ["a", "x", "c", "y"]
    for text, message in [
        ('["a", "", "c"]', f"--classes file {names} names class 1 '', an empty name"),
        ('{"a": 0, "b": "1"}', f"--classes file {names} is neither a list of class names"),
        ("a\nb\n", f"--classes file {names} is not JSON: "),
    ]:
        names.write_text(text)
        with pytest.raises(InputError) as refused:
            parse_class_names(str(names))
        assert str(refused.value).startswith(message)


def test_numbered_classes_of_a_model_without_names_need_classes(tmp_path):
    """A folder sorts `1, 10, 2` as text and a CSV index of it `1, 2, 10` as numbers: the same
    state dict scored the same images with two accuracies by the data's form."""
    import torch

    model = write_convnet_checkpoint(tmp_path / "ck.pt", in_channels=3, image_size=8, classes="xyz")
    weights = tmp_path / "weights.pt"
    torch.save(model.state_dict(), weights)
    folder = write_image_folder(tmp_path / "imgs", {"1": 1, "2": 1, "10": 1})
    index = tmp_path / "index.csv"
    rows = [f"imgs/{name}/{name}_0.png,{name}" for name in ("1", "2", "10")]
    index.write_text("path,label\n" + "\n".join(rows) + "\n")
    spec = ["eval", "convnet", "--weights", weights, "--image-size", "8", "-j", "0"]
    for data in (folder, index):
        result = run_torchkit_in_process(*spec, "--data", data)
        assert result.returncode == 2
        line = error_line(result.stderr)
        assert "the model records no class names" in line
        assert "as text they are 1, 10, 2, as numbers 1, 2, 10" in line and "--classes" in line


def test_class_indices_as_names_are_the_outputs_in_order():
    from torchkit.core.evaluate.source import refuse_guessed_class_order

    refuse_guessed_class_order([str(index) for index in range(12)], "shards/")
    refuse_guessed_class_order(["a", "b", "c"], "imgs/")
    with pytest.raises(UsageError, match="as text they are 0, 1, 10, 11, 2, 3 ..."):
        refuse_guessed_class_order(["0", "1", "10", "11", *map(str, range(2, 10))], "imgs/")
    with pytest.raises(UsageError, match="in the data b, a"):
        refuse_guessed_class_order(["b", "a"], "split/")


def test_a_class_the_model_names_twice_is_refused(tmp_path):
    """torchvision's ImageNet names hold two `crane`s: a folder `crane` was scored against the
    first alone."""
    from torchkit.core.data.sources.samples import Samples
    from torchkit.core.data.sources.source import relabelled
    from torchkit.core.io.errors import InputError
    from torchkit.core.models.checkpoint import load_checkpoint, save_checkpoint

    checkpoint = tmp_path / "ck.pt"
    write_convnet_checkpoint(checkpoint, in_channels=3, image_size=8, classes="abcd")
    saved = load_checkpoint(checkpoint)
    saved["classes"] = ["crane", "b", "crane", "c"]
    save_checkpoint(saved, checkpoint)
    write_image_folder(tmp_path / "imgs", {"b": 1, "crane": 1})
    result = run_torchkit_in_process("eval", checkpoint, "--data", tmp_path / "imgs", "-j", "0")
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert "class crane of " in line and "the name of 2 of the model's outputs (0, 2)" in line
    # Images of the other classes are matched as before.
    samples = Samples(classes=["b", "c"], labels=[0, 1], paths=["b.png", "c.png"])
    assert relabelled(samples, ["crane", "b", "crane", "c"], "x").labels == [1, 3]
    with pytest.raises(InputError, match="the name of 2"):
        relabelled(samples, ["b", "c", "b"], "x")


def test_classes_may_name_two_outputs_alike_as_imagenet_does(tmp_path):
    """torchvision's ImageNet names hold two `crane`s: a checkpoint or classes.txt with them
    loaded, while `--classes` refused them ("names crane more than once"), so ImageNet's
    names could not be given. Data labelled `crane` is still refused, its output a guess."""
    import torch

    model = write_convnet_checkpoint(
        tmp_path / "ck.pt", in_channels=3, image_size=8, classes="wxyz"
    )
    weights = tmp_path / "weights.pt"
    torch.save(model.state_dict(), weights)
    from torchkit.core.evaluate import parse_class_names

    names = ["crane", "b", "crane", "c"]
    classes = tmp_path / "classes.txt"
    classes.write_text("".join(f"{name}\n" for name in names), encoding="utf-8")
    assert parse_class_names(str(classes)) == parse_class_names(",".join(names)) == names
    spec = ["convnet", "--weights", weights, "--image-size", "8", "--classes", classes, "-j", "0"]
    unambiguous = write_image_folder(tmp_path / "bc", {"b": 2, "c": 1})
    result = run_torchkit_in_process("eval", *spec, "--data", unambiguous, "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["classes"] == names
    rows = [(row["label"], row["index"], row["support"]) for row in report["per_class"]]
    assert rows == [("crane", 0, 0), ("b", 1, 2), ("crane", 2, 0), ("c", 3, 1)]
    ambiguous = write_image_folder(tmp_path / "crane", {"b": 1, "crane": 1})
    result = run_torchkit_in_process("eval", *spec, "--data", ambiguous)
    assert result.returncode == 1 and result.stdout == ""
    line = error_line(result.stderr)
    assert "class crane of " in line and "the name of 2 of the model's outputs (0, 2)" in line
    result = run_torchkit_in_process("predict", *spec, ambiguous, "--format", "json")
    assert result.returncode == 0, result.stderr
    for row in json.loads(result.stdout):
        assert row["class"] == names[row["class_index"]]


def test_predict_names_the_outputs_of_a_model_without_names_as_eval_does(tmp_path):
    """A state dict on labelled data: eval named its outputs by the data's sorted classes and
    predict by their indices, so `label` a stood beside `class` 0; where eval cannot name them
    (numbered classes, unlabelled images) `class` is the index, and a note says so."""
    import torch

    model = write_convnet_checkpoint(tmp_path / "ck.pt", in_channels=3, image_size=8, classes="xyz")
    weights = tmp_path / "weights.pt"
    torch.save(model.state_dict(), weights)
    letters = write_image_folder(tmp_path / "letters", {"a": 2, "b": 1, "c": 1})
    numbers = write_image_folder(tmp_path / "numbers", {"1": 1, "2": 1, "10": 1})
    spec = ["predict", "convnet", "--weights", weights, "--image-size", "8", "-j", "0"]
    expected = {letters: ["a", "b", "c"], numbers: ["0", "1", "2"]}
    for images, names in expected.items():
        result = run_torchkit_in_process(*spec, images, "--format", "json")
        assert result.returncode == 0, result.stderr
        for row in json.loads(result.stdout):
            assert row["class"] == names[row["class_index"]]
        note = " ".join(result.stderr.split())
        assert "the model records no class names" in note
        if images == letters:
            assert f"named by the classes of {letters} in sorted order, as eval" in note
        else:
            assert "`class` is the index of its output" in note
            assert "as text they are 1, 10, 2, as numbers 1, 2, 10" in note


def test_the_help_of_classes_says_what_a_model_without_names_gets(_torchkit_command):
    """predict's --help said such a model's classes were always the output index."""
    for command in ("eval", "predict"):
        options = _torchkit_command.commands[command].params
        help_text = next(option.help for option in options if "--classes" in option.opts)
        assert "sorted order" in help_text, (command, help_text)


@pytest.mark.parametrize("names", [["zebra", "ant", "cow"], ["1", "2", "10"]])
def test_a_label_order_the_data_states_names_the_outputs_of_a_model_without_names(tmp_path, names):
    """HF's ClassLabel names are in the dataset's own order (imagenet-1k, fashion_mnist): the
    labels are output indices, no sorting guessed them. eval refused such data ('which of its
    outputs is which class ... is a guess') and predict named the outputs by index."""
    import torch
    from parquet_files import png, write_parquet

    model = write_convnet_checkpoint(tmp_path / "ck.pt", in_channels=3, image_size=8, classes="xyz")
    weights = tmp_path / "weights.pt"
    torch.save(model.state_dict(), weights)
    data = tmp_path / "pq" / "train-00000-of-00001.parquet"
    write_parquet(data, [png(i) for i in range(6)], [i % 3 for i in range(6)], names=names)
    spec = ["convnet", "--weights", weights, "--image-size", "8", "-j", "0"]
    result = run_torchkit_in_process("eval", *spec, "--data", data, "--format", "json")
    assert result.returncode == 0, result.stderr
    by_class = {row["label"]: row["index"] for row in json.loads(result.stdout)["per_class"]}
    assert by_class == {name: index for index, name in enumerate(names)}
    result = run_torchkit_in_process("predict", *spec, data, "--format", "json")
    assert result.returncode == 0, result.stderr
    for row in json.loads(result.stdout):
        assert row["class"] == names[row["class_index"]]
    assert "in its label order, as eval" in " ".join(result.stderr.split())
