"""`torchkit predict` of a model with 1,000 outputs and no class names (an ImageNet model's state
dict as --weights): its outputs named as ImageNet-1k's classes, by timm's names for a timm model
(as its own ImageNet weights are named) and torchvision's for others, with a note saying whose;
a timm model's head of one of timm's larger ImageNet subsets (11,821 outputs: ImageNet-12k...)
named as that subset's classes; never where names are known, for other counts, or for random
weights."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from processes import run_torchkit_in_process

from torchkit.core.inference import class_names
from torchkit.core.inference.class_names import imagenet_class_names, output_names_from_data

IMAGENET = list(torchvision.models._meta._IMAGENET_CATEGORIES)
ASSUMED = (
    "its 1000 outputs are assumed to be ImageNet-1k's classes, named as torchvision names them "
    "(otherwise pass --classes with the names of its outputs, in order)"
)
ASSUMED_BY_TIMM = ASSUMED.replace("as torchvision names", "as timm names")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """resnet18's state dicts, with 1,000 outputs and with 10; photos/ of two unlabelled
    images."""
    root = tmp_path_factory.mktemp("imagenet_names")
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18().state_dict(), root / "imagenet.pth")
    torch.save(torchvision.models.resnet18(num_classes=10).state_dict(), root / "ten.pth")
    rng = np.random.default_rng(0)
    (root / "photos").mkdir()
    for name in ("a.png", "b.png"):
        pixels = rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / "photos" / name)
    return root


def predict(world, *args: object):
    done = run_torchkit_in_process(
        "predict", "resnet18", world / "photos", "--image-size", 32, "-k", 3, "--format", "json",
        "-j", "0", "--device", "cpu", *args,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_a_state_dict_of_1000_outputs_is_named_as_imagenet(world):
    rows, stderr = predict(world, "--weights", world / "imagenet.pth")
    assert len(IMAGENET) == 1000 and IMAGENET[0] == "tench"
    for row in rows:
        assert row["class"] == IMAGENET[row["class_index"]]
        for rank in (1, 2, 3):
            assert row[f"class_{rank}"] == IMAGENET[row[f"class_index_{rank}"]]
    notes = [line for line in stderr.splitlines() if "class names" in line]
    assert notes == [f"Note: the model records no class names: {ASSUMED}"]


def test_csv_names_them_too(world):
    done = run_torchkit_in_process(
        "predict", "resnet18", "--weights", world / "imagenet.pth", world / "photos",
        "--image-size", 32, "--format", "csv", "-j", "0", "--device", "cpu",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "path,label,class,class_index,probability,error"
    for line in lines[1:]:
        fields = line.split(",")
        assert fields[2] == IMAGENET[int(fields[3])]


def test_names_given_or_recorded_come_first(world, tmp_path):
    names = [f"thing {index}" for index in range(1000)]
    listed = tmp_path / "names.txt"
    listed.write_text("".join(f"{name}\n" for name in names))
    rows, stderr = predict(world, "--weights", world / "imagenet.pth", "--classes", listed)
    assert all(row["class"] == names[row["class_index"]] for row in rows)
    assert "ImageNet" not in stderr


def test_other_output_counts_keep_their_indices(world):
    rows, stderr = predict(world, "--weights", world / "ten.pth")
    assert all(row["class"] == str(row["class_index"]) for row in rows)
    assert "`class` is the index of its output" in stderr and "ImageNet" not in stderr


def test_random_weights_keep_their_indices(world):
    """A name without --weights (--allow-untrained) was trained on nothing: no names assumed."""
    rows, stderr = predict(world, "--allow-untrained")
    assert all(row["class"] == str(row["class_index"]) for row in rows)
    assert "ImageNet" not in stderr
    # A model built by code may load trained weights itself, which torchkit cannot tell
    # (--allow-untrained runs it): its 1,000 outputs are named as ImageNet's, as documented.
    done = run_torchkit_in_process(
        "predict", "torchvision.models:resnet18", world / "photos", "--allow-untrained",
        "--image-size", 32, "--format", "json", "-j", "0", "--device", "cpu",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert all(row["class"] == IMAGENET[row["class_index"]] for row in json.loads(done.stdout))
    assert f"Note: the model records no class names: {ASSUMED}" in done.stderr


def test_without_torchvisions_names_the_indices_quietly(world, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision.models._meta", None)  # an import that fails
    assert imagenet_class_names() is None
    rows, stderr = predict(world, "--weights", world / "imagenet.pth")
    assert all(row["class"] == str(row["class_index"]) for row in rows)
    assert "`class` is the index of its output" in stderr and "ImageNet" not in stderr
    assert "Warning" not in stderr


def test_labelled_data_of_as_many_classes_names_them_first():
    data = [f"n{index:08d}" for index in range(1000)]  # ImageNet's folders, sorted
    names, note = output_names_from_data(data, 1000, "val", imagenet=True)
    assert names == data and "named by the classes of val" in note
    names, note = output_names_from_data(["cat", "dog"], 1000, "photos", imagenet=True)
    assert names == IMAGENET
    assert note == (
        "the model records no class names; the 2 classes of photos are not its 1000 outputs, "
        "which are assumed to be ImageNet-1k's classes, named as torchvision names them "
        "(otherwise pass --classes with the names of its outputs, in order)"
    )
    # as many classes as outputs, in an order sorting does not settle (1, 10, 100... as text):
    # they are the outputs' classes, which is which unknown; ImageNet's would contradict them
    numbered = [str(number) for number in range(1, 1001)]
    names, note = output_names_from_data(numbered, 1000, "val", imagenet=True)
    assert names == [str(index) for index in range(1000)]
    assert "is a guess" in note and "ImageNet" not in note
    names, _ = output_names_from_data([], 999, "photos", imagenet=True)
    assert names == [str(index) for index in range(999)]
    names, _ = output_names_from_data([], 1000, "photos")  # random weights: never assumed
    assert names == [str(index) for index in range(1000)]


# Where timm's names and torchvision's differ: the bird `crane` (torchvision's `crane bird`; the
# machine, 517, is `crane` in both) and the swimsuit `maillot` (`maillot tank suit`), 639.
TOP = (134, 639, 517)
TIMM_TOP = ["crane", "maillot", "crane"]
TORCHVISION_TOP = ["crane bird", "maillot tank suit", "crane"]


def ranked(model, path) -> None:
    """`model`'s 1,000-output classifier made to rank TOP first, saved as a state dict."""
    head = model.get_classifier() if hasattr(model, "get_classifier") else model.fc
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        for rank, index in enumerate(TOP):
            head.bias[index] = 10.0 - rank
    torch.save(model.state_dict(), path)


def top_names(done) -> tuple[list[list[str]], list[str]]:
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    for row in rows:
        assert [row[f"class_index_{rank}"] for rank in (1, 2, 3)] == list(TOP)
    names = [[row[f"class_{rank}"] for rank in (1, 2, 3)] for row in rows]
    return names, [line for line in done.stderr.splitlines() if "class names" in line]


def predict_top(model: str, weights, photos):
    return run_torchkit_in_process(
        "predict", model, "--weights", weights, photos, "--image-size", 32, "-k", 3,
        "--format", "json", "-j", "0", "--device", "cpu",
    )  # fmt: skip


@pytest.fixture(scope="module")
def timm_weights(world):
    """A timm model's 1,000-output state dict (timm's smallest ResNet) ranking TOP first."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    ranked(timm.create_model("test_resnet"), world / "timm.pth")
    return world / "timm.pth"


def test_a_timm_model_is_named_as_timm_names_imagenet(world, timm_weights):
    """`timm/NAME --weights FILE`: timm's names, as `--weights DEFAULT` (timm's own ImageNet
    weights) names them: the first name of each description timm's inference.py prints."""
    import timm
    from timm.data import ImageNetInfo

    from torchkit.core.models.timm_models import imagenet_classes

    names, notes = top_names(predict_top("timm/test_resnet", timm_weights, world / "photos"))
    assert names == [TIMM_TOP, TIMM_TOP]
    assert notes == [f"Note: the model records no class names: {ASSUMED_BY_TIMM}"]
    timm_names = class_names.timm_imagenet_class_names()
    descriptions = ImageNetInfo().label_descriptions()
    assert timm_names == [description.split(",")[0] for description in descriptions]
    assert [timm_names[i] for i in TOP] == TIMM_TOP
    differ = [i for i, (a, b) in enumerate(zip(timm_names, IMAGENET, strict=True)) if a != b]
    assert differ == [134, 639]
    assert imagenet_classes(timm.create_model("test_resnet")) == timm_names  # DEFAULT's names


def test_a_torchvision_model_is_named_as_torchvision_names_imagenet(world):
    torch.manual_seed(0)
    ranked(torchvision.models.resnet18(), world / "ranked.pth")
    names, notes = top_names(predict_top("resnet18", world / "ranked.pth", world / "photos"))
    assert names == [TORCHVISION_TOP, TORCHVISION_TOP]
    assert notes == [f"Note: the model records no class names: {ASSUMED}"]


def test_a_timm_model_without_timms_names_takes_torchvisions(world, timm_weights, monkeypatch):
    """A timm whose ImageNet list is missing or broken: torchvision's names, and the note says
    so."""
    import timm.data

    def broken(*args, **kwargs):
        raise FileNotFoundError("imagenet_synsets.txt")

    monkeypatch.setattr(timm.data, "ImageNetInfo", broken)
    assert class_names.timm_imagenet_class_names() is None
    names, notes = top_names(predict_top("timm/test_resnet", timm_weights, world / "photos"))
    assert names == [TORCHVISION_TOP, TORCHVISION_TOP]
    assert notes == [f"Note: the model records no class names: {ASSUMED}"]


def test_without_timm_its_names_are_torchvisions(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm.data", None)  # an import that fails
    assert class_names.timm_imagenet_class_names() is None
    names, note = output_names_from_data([], 1000, "photos", imagenet=True, timm=True)
    assert names == IMAGENET and note.endswith(ASSUMED)


# timm's larger ImageNet heads: each size is one subset's (as timm's inference.py infers it).
SUBSETS = {
    11221: ("imagenet-21k-miil", "ImageNet-21k-miil"),
    11821: ("imagenet-12k", "ImageNet-12k"),
    21841: ("imagenet-22k", "ImageNet-22k"),
    21842: ("imagenet-22k-ms", "ImageNet-22k-ms"),
    21843: ("imagenet-21k-goog", "ImageNet-21k-goog"),
}


def first_names(subset: str) -> list[str]:
    from timm.data import ImageNetInfo

    return [d.split(",")[0].strip() for d in ImageNetInfo(subset).label_descriptions()]


@pytest.mark.parametrize("outputs", [21843, 11821])
def test_a_timm_head_of_a_larger_imagenet_is_named_as_its_subset(world, outputs):
    """`timm/NAME --weights FILE` of a 21,843-output head (Google's ImageNet-21k, as timm's
    in21k weights have) or an 11,821-output one (timm's ImageNet-12k): the subset's names as
    timm describes them, the note saying which subset was assumed."""
    timm = pytest.importorskip("timm")
    from timm.data import ImageNetInfo

    subset, shown = SUBSETS[outputs]
    top = (outputs - 1, 7000, 2)  # the last class, one inside, one near the start
    torch.manual_seed(0)
    model = timm.create_model("test_resnet", num_classes=outputs)
    head = model.get_classifier()
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        for rank, index in enumerate(top):
            head.bias[index] = 10.0 - rank
    weights = world / f"timm_{outputs}.pth"
    torch.save(model.state_dict(), weights)
    done = predict_top("timm/test_resnet", weights, world / "photos")
    assert done.returncode == 0, done.stderr
    info = ImageNetInfo(subset)
    expected = [info.index_to_description(index).split(",")[0] for index in top]
    for row in json.loads(done.stdout):
        assert [row[f"class_index_{rank}"] for rank in (1, 2, 3)] == list(top)
        assert [row[f"class_{rank}"] for rank in (1, 2, 3)] == expected
        assert row["class"] == expected[0]
    notes = [line for line in done.stderr.splitlines() if "class names" in line]
    assert notes == [
        f"Note: the model records no class names: its {outputs} outputs are assumed to be "
        f"{shown}'s classes, named as timm names them (otherwise pass --classes with the names "
        "of its outputs, in order)"
    ]


def test_every_subset_timm_infers_is_named():
    """Each head size timm's inference.py names takes that subset's names, timm's first name
    of each class; the note names the subset, also where labelled data does not fit."""
    pytest.importorskip("timm")
    from timm.data import infer_imagenet_subset

    for outputs, (subset, shown) in SUBSETS.items():
        assert infer_imagenet_subset({"num_classes": outputs}) == subset
        assert class_names.timm_imagenet_subset(outputs) == subset
        names, note = output_names_from_data([], outputs, "photos", imagenet=True, timm=True)
        assert names == first_names(subset) and len(names) == outputs
        assert f"its {outputs} outputs are assumed to be {shown}'s classes" in note
    names, note = output_names_from_data(["cat", "dog"], 21843, "photos", imagenet=True, timm=True)
    assert names == first_names("imagenet-21k-goog")
    assert note == (
        "the model records no class names; the 2 classes of photos are not its 21843 outputs, "
        "which are assumed to be ImageNet-21k-goog's classes, named as timm names them "
        "(otherwise pass --classes with the names of its outputs, in order)"
    )


def test_larger_heads_keep_their_indices_where_not_timms():
    """A torchvision model (torchvision ships only ImageNet-1k's names), random weights, names
    known, other sizes, a timm without the subset: each output's index."""
    pytest.importorskip("timm")
    indices = [str(index) for index in range(21843)]
    names, note = output_names_from_data([], 21843, "photos", imagenet=True)  # torchvision
    assert names == indices and "ImageNet" not in note
    names, note = output_names_from_data([], 21843, "photos", timm=True)  # random weights
    assert names == indices and "ImageNet" not in note
    data = [f"n{index:08d}" for index in range(21843)]  # labelled data of as many classes
    names, note = output_names_from_data(data, 21843, "val", imagenet=True, timm=True)
    assert names == data and "ImageNet" not in note
    for outputs in (10450, 21844, 200, 100):  # miil's winter-21 list, ImageNet-A/R, mini
        names, note = output_names_from_data([], outputs, "photos", imagenet=True, timm=True)
        assert names == [str(index) for index in range(outputs)] and "ImageNet" not in note


def test_a_head_size_two_subsets_share_keeps_its_indices(monkeypatch):
    """Where two subsets timm ships list as many classes in other orders, which of them the
    head's are is a guess: the indices, while the other sizes keep their names."""
    pytest.importorskip("timm")
    import pkgutil

    from timm.data import imagenet_info

    real = pkgutil.get_data

    def get_data(package, resource):
        if resource.endswith("imagenet12k_reordered.txt"):
            lines = real(package, "_info/imagenet12k_synsets.txt").decode("utf-8").splitlines()
            return "\n".join(reversed(lines)).encode("utf-8")
        return real(package, resource)

    monkeypatch.setattr(pkgutil, "get_data", get_data)
    tables = {**imagenet_info._SUBSETS, "imagenet12kreordered": "imagenet12k_reordered.txt"}
    monkeypatch.setattr(imagenet_info, "_SUBSETS", tables)
    assert class_names.timm_imagenet_subset(11821) is None
    names, note = output_names_from_data([], 11821, "photos", imagenet=True, timm=True)
    assert names == [str(index) for index in range(11821)] and "ImageNet" not in note
    assert class_names.timm_imagenet_subset(21843) == "imagenet-21k-goog"
    # an alias of the same list (timm's imagenet21k and imagenet21kgoog) is no second subset
    tables = {**imagenet_info._SUBSETS, "imagenet12kagain": "imagenet12k_synsets.txt"}
    monkeypatch.setattr(imagenet_info, "_SUBSETS", tables)
    assert class_names.timm_imagenet_subset(21841) == "imagenet-22k"


def test_a_subset_whose_list_is_not_its_size_keeps_the_indices(monkeypatch):
    """A timm whose table maps a size to a list of another length: no names, no traceback."""
    pytest.importorskip("timm")
    from timm.data import imagenet_info

    sizes = {**imagenet_info._NUM_CLASSES_TO_SUBSET, 21844: "imagenet-22k"}
    monkeypatch.setattr(imagenet_info, "_NUM_CLASSES_TO_SUBSET", sizes)
    names, note = output_names_from_data([], 21844, "photos", imagenet=True, timm=True)
    assert names == [str(index) for index in range(21844)] and "ImageNet" not in note
