"""Model files as users have them besides torchkit's own checkpoints, and files that must be
refused before they are read."""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path

import pytest
import torch
import torchvision
from hostile_pickles import RunsShell
from output_checks import error_line
from processes import run_torchkit_in_process
from safetensors.torch import save_file
from torch import nn

from torchkit.core.io.errors import CheckpointError
from torchkit.core.models import checkpoint as checkpoint_module
from torchkit.core.models import resolve_model
from torchkit.core.models.checkpoint import load_checkpoint
from torchkit.core.models.convnet import convnet_class
from torchkit.core.models.weights import load_weights_file


def small_convnet(num_classes: int = 3) -> nn.Module:
    torch.manual_seed(0)
    model = convnet_class()(num_classes, 3, 28).eval()
    with torch.no_grad():  # BatchNorm statistics that are not the defaults
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-1, 1)
    return model


@pytest.mark.parametrize("prefix", ["model.", "net."])
def test_weights_under_a_training_wrappers_prefix_load_as_the_model(tmp_path, prefix):
    """A Lightning module keeping the network as `self.model` saves `model.conv1.weight`...:
    refused before ("N missing keys (first: ...); N unexpected keys (first: model....)",
    hint "check --model and --num-classes"); now the prefix is dropped, and the head sized
    from the file (3 classes in a model built with 10)."""
    truth = small_convnet(3)
    path = tmp_path / "lightning.ckpt"
    state = {f"{prefix}{key}": value for key, value in truth.state_dict().items()}
    torch.save({"state_dict": state, "epoch": 4, "global_step": 40}, path)
    resolved = resolve_model("convnet", weights=str(path))
    batch = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        assert torch.equal(resolved.model.eval()(batch), truth(batch))


def test_a_shared_prefix_that_does_not_give_the_models_keys_is_still_refused(tmp_path):
    """Only a prefix whose removal gives exactly the model's keys is dropped: other weights
    under one prefix are still refused, naming the keys."""
    state = {f"model.{key}": value for key, value in small_convnet(3).state_dict().items()}
    state["model.extra.weight"] = torch.zeros(1)
    path = tmp_path / "other.ckpt"
    torch.save({"state_dict": state}, path)
    with pytest.raises(CheckpointError, match="unexpected keys"):
        resolve_model("convnet", weights=str(path))


def test_torchvisions_own_densenet_files_load(tmp_path):
    """torchvision's DenseNet weights files, as it downloads them, name a dense layer's parts
    `norm.1`, `conv.2` (and have no BatchNorm counters); torchvision renames them when it loads
    them. `densenet121 --weights densenet121-a639ec97.pth` said '580 missing keys (first:
    ...denselayer1.norm1.weight); 696 unexpected keys (first: ...denselayer1.norm.1.weight)'."""
    torch.manual_seed(0)
    truth = torchvision.models.DenseNet(4, (1, 2), 8, bn_size=2, num_classes=3).eval()
    old = {
        re.sub(r"(denselayer\d+\.(?:norm|relu|conv))([12])\.", r"\1.\2.", key): value
        for key, value in truth.state_dict().items()
        if not key.endswith("num_batches_tracked")
    }
    assert "features.denseblock1.denselayer1.norm.1.weight" in old
    torch.save(old, tmp_path / "densenet-old.pth")
    model = torchvision.models.DenseNet(4, (1, 2), 8, bn_size=2, num_classes=3).eval()
    load_weights_file(model, str(tmp_path / "densenet-old.pth"))
    batch = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(batch), truth(batch))


def test_torchvisions_own_googlenet_file_takes_images_as_torchvisions_model_does(
    tmp_path, monkeypatch
):
    """torchvision builds googlenet and inception_v3 with `transform_input=True` for its own
    weights: `googlenet --weights googlenet-1378be20.pth` (its file) fed ImageNet-normalised
    images to a model that does not re-normalise them, so its outputs silently differed from
    torchvision's. The file, known by its sha256 (here a hand-made one, under another name),
    now gets the normalisation those weights expect; another googlenet file does not."""
    import hashlib
    from types import SimpleNamespace

    from torchkit.core.models import builders

    torch.manual_seed(0)
    truth = torchvision.models.googlenet(transform_input=True, init_weights=False).eval()
    with torch.no_grad():  # BatchNorm statistics that are not the defaults
        for module in truth.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-1, 1)
    torch.save(truth.state_dict(), tmp_path / "renamed.pth")
    digest = hashlib.sha256((tmp_path / "renamed.pth").read_bytes()).hexdigest()
    url = f"https://download.pytorch.org/models/googlenet-{digest[:8]}.pth"
    monkeypatch.setattr(builders, "torchvision_weights_enum", lambda _: [SimpleNamespace(url=url)])
    finetuned = {key: value.clone() for key, value in truth.state_dict().items()}
    finetuned["fc.bias"] += 1
    torch.save(finetuned, tmp_path / "finetuned.pth")  # not torchvision's file
    truth.aux_logits, truth.aux1, truth.aux2 = False, None, None  # as torchvision drops them
    pixels = torch.rand(1, 3, 64, 64)
    imagenet = torchvision.transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    resolved = resolve_model("googlenet", weights=str(tmp_path / "renamed.pth"))
    assert resolved.weights_source == "torchvision weights"
    ours = torchvision.transforms.Normalize(resolved.preprocess.mean, resolved.preprocess.std)
    with torch.no_grad():
        expected = truth(imagenet(pixels))
        torch.testing.assert_close(resolved.model.eval()(ours(pixels)), expected)
    assert not builders.is_torchvision_transform_input_file("googlenet", tmp_path / "finetuned.pth")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_pickled_model_predicts(tmp_path, make_image_folder, dtype):
    """`torch.save(model.half())` then `predict FILE --trust-checkpoint`: before -> 'Error: the
    model fails on 16x16 images: Input type (torch.FloatTensor) and weight type
    (torch.HalfTensor) should be the same ... (check --image-size ...)', exit 1; now the model
    runs in float32, as half-precision weights loaded into a built model do."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
    torch.save(net.to(dtype), tmp_path / "half.pt")
    resolved = resolve_model(str(tmp_path / "half.pt"), trust_checkpoint=True)
    batch = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(resolved.model(batch), net.float()(batch))
    images = make_image_folder(tmp_path / "images", {"a": 1, "b": 1}, size=16)
    result = run_torchkit_in_process(
        "predict", tmp_path / "half.pt", images, "--trust-checkpoint", "--image-size", "16",
        "--device", "cpu", "-j", "0", "--format", "csv",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 3


HALF_NET = """
import torch
from torch import nn


def make(num_classes=2):
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    return nn.Sequential(net, nn.Linear(4, num_classes)).to(torch.{dtype})
"""


PREDICT = ("predict", "{spec}", "{images}", "--allow-untrained", "--format", "csv")
TRAIN = ("train", "--model", "{spec}", "--data", "{images}", "--val-split", "0.5", "--epochs")
TRAIN += ("1", "--batch-size", "2", "--out", "run")


@pytest.mark.parametrize(
    ("command", "dtype"),
    [(PREDICT, "float16"), (PREDICT, "bfloat16"), (PREDICT, "float64"), (TRAIN, "float16")],
    ids=["predict-float16", "predict-bfloat16", "predict-float64", "train-float16"],
)
def test_a_callable_that_builds_a_half_precision_model_runs_in_float32(
    tmp_path, make_image_folder, dtype, command
):
    """`package.module:Callable` returning `model.half()` (or bfloat16, float64): before ->
    'Error: the model fails on 16x16 images: Input type (float) and bias type (c10::Half)
    should be the same (check --image-size ...)' in predict, eval and extract-features,
    'Error: RuntimeError: Input type (float) ...' in train, exit 1; now the model runs in
    float32, as the same model pickled does."""
    module = f"halfnet_{command[0]}_{dtype}"  # one module a case: imports are cached
    (tmp_path / f"{module}.py").write_text(HALF_NET.format(dtype=dtype))
    images = make_image_folder(tmp_path / "images", {"a": 2, "b": 2}, size=16)
    args = [arg.format(spec=f"{module}:make", images=images) for arg in command]
    result = run_torchkit_in_process(
        *args, "--image-size", "16", "--device", "cpu", "-j", "0", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr


def deflated(source: Path, target: Path) -> Path:
    """`source`, a torch.save archive, with its records deflated (as another zip tool writes)."""
    with (
        zipfile.ZipFile(source) as plain,
        zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as out,
    ):
        for name in plain.namelist():
            out.writestr(name, plain.read(name))
    return target


def test_a_zip_bomb_is_refused_before_it_is_unpacked(tmp_path, monkeypatch):
    """torch.load unpacks deflated records (torch.save never writes any): a 2 MB file held
    2 GB of zeros that it put in memory. An archive whose compressed records expand far beyond
    their size is refused before torch reads it (the floor lowered here to keep the file tiny)."""
    monkeypatch.setattr(checkpoint_module, "EXPANSION_FLOOR", 2**20, raising=False)
    plain = tmp_path / "plain.pt"
    torch.save({"w": torch.zeros(2**19)}, plain)  # 2 MiB of zeros
    bomb = deflated(plain, tmp_path / "bomb.pt")
    assert bomb.stat().st_size < 2**15
    with pytest.raises(CheckpointError, match="would expand from"):
        load_checkpoint(bomb)
    result = run_torchkit_in_process("convert", "checkpoint", bomb, tmp_path / "out.safetensors")
    assert result.returncode == 1
    assert "compressed records" in error_line(result.stderr)
    assert not (tmp_path / "out.safetensors").exists()
    # Records deflated to about their own size (another zip tool) still load.
    torch.save({"w": torch.randn(2**19)}, plain)
    rezipped = deflated(plain, tmp_path / "rezipped.pt")
    assert torch.equal(load_checkpoint(rezipped)["w"], torch.load(plain)["w"])


def test_a_pickle_that_runs_a_command_is_refused_naming_the_function(tmp_path: Path):
    """weights_only refuses `os.system` ("unsupported GLOBAL posix.system whose module posix is
    blocked" in recent torch), and the message said only "holds a pickled object"; it names
    the function now. The command never runs, in any command that loads the file."""
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pt"
    torch.save({"state_dict": {"w": torch.zeros(1)}, "x": RunsShell(marker)}, path)
    commands = [
        ("summary", path),
        ("summary", "convnet", "--weights", path),
        ("convert", "checkpoint", path, tmp_path / "out.pt"),
        ("train", "--data", "digits", "--resume", path),
    ]
    for command in commands:
        result = run_torchkit_in_process(*command)
        assert result.returncode == 1
        assert f"{path} holds a pickled posix.system," in error_line(result.stderr)
    assert not marker.exists()


def test_a_layer_of_another_shape_says_which_shape_is_whose(tmp_path):
    """convnet weights of 28 px loaded for 32 px: 'classifier.1.weight (128, 9216) vs (128,
    12544)' did not say which was the file's, and the hint named only --model and
    --num-classes."""
    torch.save(small_convnet(3).state_dict(), tmp_path / "conv28.pt")
    result = run_torchkit_in_process(
        "summary", "convnet", "--weights", tmp_path / "conv28.pt", "--image-size", "32"
    )
    assert result.returncode == 1
    assert error_line(result.stderr).endswith(
        "(first: classifier.1.weight is (128, 9216) in the weights, (128, 12544) in the model) "
        "(check the model and --image-size)"
    )


def test_a_weights_file_is_read_by_what_it_holds_not_its_name(tmp_path):
    """A safetensors file named `.pt` ('not a PyTorch checkpoint (neither torch.save's zip
    archive nor a pickle)') and a torch.save file named `.safetensors` ('Error while
    deserializing header: header too large') load as what they are."""
    truth = small_convnet(3)
    state = {key: value.contiguous() for key, value in truth.state_dict().items()}
    save_file(state, str(tmp_path / "weights.pt"))
    torch.save(state, tmp_path / "weights.safetensors")
    batch = torch.randn(2, 3, 28, 28)
    for name in ("weights.pt", "weights.safetensors"):
        resolved = resolve_model("convnet", weights=str(tmp_path / name))
        with torch.no_grad():
            assert torch.equal(resolved.model.eval()(batch), truth(batch)), name
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match="cannot read safetensors file"):
        load_checkpoint(tmp_path / "junk.safetensors")


def test_a_legacy_text_pickle_is_named_and_loads_only_with_trust(tmp_path):
    """torch.save(..., pickle_protocol=0 or 1, _use_new_zipfile_serialization=False): before ->
    'not a PyTorch checkpoint (neither torch.save's zip archive nor a pickle)'. It is named as
    the legacy format the safe loader cannot read, and --trust-checkpoint is suggested (and
    loads protocol 1; torch itself cannot read protocol 0's tensors: said so)."""
    truth = small_convnet(3)
    for protocol in (0, 1):
        path = tmp_path / f"p{protocol}.pt"
        torch.save(truth.state_dict(), path, pickle_protocol=protocol,
                   _use_new_zipfile_serialization=False)  # fmt: skip
        with pytest.raises(CheckpointError, match="legacy format with pickle protocol 0 or 1") as e:
            load_checkpoint(path)
        assert "weights_only" in str(e.value) and "--trust-checkpoint" in e.value.hint
    loaded = load_checkpoint(tmp_path / "p1.pt", trust_checkpoint=True)
    assert torch.equal(loaded["classifier.4.weight"], truth.state_dict()["classifier.4.weight"])
    with pytest.raises(CheckpointError, match="which this PyTorch cannot read") as e:
        load_checkpoint(tmp_path / "p0.pt", trust_checkpoint=True)
    assert e.value.hint == (
        "save it again with a plain torch.save, without pickle_protocol, where it loads"
    )
    result = run_torchkit_in_process("summary", "convnet", "--weights", tmp_path / "p0.pt")
    assert result.returncode == 1
    assert "torch.save's legacy format" in error_line(result.stderr)


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_pickle_protocols_3_to_5_load_without_trust_as_protocol_2_does(tmp_path, legacy):
    """torch.save(..., pickle_protocol=4 or 5), in the zip or the legacy format: before, refused
    as 'pickled with protocol 4 ..., which the safe loader (weights_only) cannot read', to be
    saved again or loaded with --trust-checkpoint (running whatever it held); protocol 3 with
    bytes in it: 'Unsupported operand 67 (the file may be truncated ...)'. Its tensors, shared
    views and plain values load as a trusted load reads them."""
    truth = small_convnet(3).state_dict()
    checkpoint = {"model": truth, "same": truth, "view": truth["classifier.4.weight"][1:],
                  "plain": [1.5, 2**70, (None, True, "names", b"\x00\xff")]}  # fmt: skip
    for protocol in (2, 3, 4, 5):
        path = tmp_path / f"p{protocol}.pt"
        torch.save(checkpoint, path, pickle_protocol=protocol,
                   _use_new_zipfile_serialization=not legacy)  # fmt: skip
        loaded = load_checkpoint(path)
        trusted = load_checkpoint(path, trust_checkpoint=True)
        assert loaded["model"].keys() == truth.keys()
        for key, value in truth.items():
            assert torch.equal(loaded["model"][key], value), (protocol, key)
        assert loaded["same"] is loaded["model"]
        assert torch.equal(loaded["view"], trusted["view"])
        assert loaded["plain"] == trusted["plain"]
    result = run_torchkit_in_process("summary", "convnet", "--weights", tmp_path / "p4.pt")
    assert result.returncode == 0, result.stderr


def test_protocol_4_loads_where_torch_is_told_to_load_weights_only(tmp_path, monkeypatch):
    """TORCH_FORCE_WEIGHTS_ONLY_LOAD=1: before, 'RuntimeError: Can not safely load weights when
    explicit pickle_module is specified (the file may be truncated ...)'. The variable is set
    again afterwards."""
    truth = small_convnet(3).state_dict()
    path = tmp_path / "p4.pt"
    torch.save(truth, path, pickle_protocol=4)
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "1")
    loaded = load_checkpoint(path)
    assert torch.equal(loaded["classifier.4.weight"], truth["classifier.4.weight"])
    assert os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] == "1"


def test_a_value_protocol_4_spells_beyond_protocol_2_is_named_with_what_to_do(tmp_path):
    """A set, which protocol 4 builds by adding items (ADDITEMS), is not read without trust."""
    path = tmp_path / "p4.pt"
    torch.save({"model": small_convnet(3).state_dict(), "classes": {"a", "b"}}, path,
               pickle_protocol=4)  # fmt: skip
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(path)
    assert refused.value.message == (
        f"cannot read checkpoint {path}: it is pickled with protocol 4 and holds a value the "
        "safe loader (weights_only) cannot read (pickle opcode ADDITEMS)"
    )
    assert refused.value.hint == (
        "save the weights alone, the model's state_dict, with torch.save, or pass "
        "--trust-checkpoint to load it, only if you trust where it came from"
    )
    assert load_checkpoint(path, trust_checkpoint=True)["classes"] == {"a", "b"}


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("protocol", [4, 5])
def test_a_hostile_pickle_of_protocol_4_or_5_runs_nothing(tmp_path, protocol, legacy):
    """The weights-only rules hold for the newer protocols: a callable off the allow-list is
    refused, named, before it is called."""
    marker = tmp_path / "ran"
    path = tmp_path / "hostile.pt"
    torch.save({"model": small_convnet(3).state_dict(), "x": RunsShell(marker)}, path,
               pickle_protocol=protocol, _use_new_zipfile_serialization=not legacy)  # fmt: skip
    with pytest.raises(checkpoint_module.UntrustedPickleError) as refused:
        load_checkpoint(path)
    assert refused.value.message == (
        f"{path} holds a pickled posix.system, not only tensors and plain values"
    )
    result = run_torchkit_in_process("summary", "convnet", "--weights", path)
    assert result.returncode == 1
    assert "holds a pickled posix.system" in error_line(result.stderr)
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [2, 4])
def test_a_plain_pickle_is_named_and_not_offered_trust(tmp_path, protocol):
    """pickle.dump of tensors, which torch.load reads in no mode ("Invalid magic number;
    corrupt file?" trusted). Before: protocol 2 said it held a pickled
    torch.storage._load_from_bytes and to pass --trust-checkpoint, which then failed; protocol
    4 said 'Unsupported operand 149 (the file may be truncated ...)'."""
    import pickle

    path = tmp_path / "plain.pt"
    path.write_bytes(pickle.dumps({"w": torch.zeros(2)}, protocol=protocol))
    for trusted in (False, True):
        with pytest.raises(CheckpointError) as refused:
            load_checkpoint(path, trust_checkpoint=trusted)
        assert refused.value.message == (
            f"cannot read checkpoint {path}: it is a plain pickle (pickle.dump), not a file "
            "torch.save wrote, which torch.load does not read"
        )
        assert refused.value.hint == ("save the model's state_dict with torch.save")


class _TruncatedNormalDraws(torch.overrides.TorchFunctionMode):
    """Counts the draws of `torch.nn.init.trunc_normal_` (`normal_`, or `erfinv_` in older
    torch; the function itself is not seen): googlenet's and inception_v3's own initialisation,
    most of their build time. PyTorch's default init of their layers draws neither."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", "") in ("normal_", "erfinv_")
        return func(*args, **(kwargs or {}))


def test_a_googlenet_checkpoint_or_weights_file_skips_the_slow_random_initialisation(tmp_path):
    """`model_from_checkpoint` (eval, predict, export...) and `googlenet --weights FILE` built
    googlenet with torchvision's truncated-normal initialisation only to overwrite every weight
    strictly from the file: built without it now, and every weight is still the file's."""
    from torchkit.core.models.builders import build_model, model_from_checkpoint

    torch.manual_seed(0)
    trained = torchvision.models.googlenet(num_classes=2, aux_logits=False, init_weights=False)
    checkpoint = {"format_version": 2, "arch": "googlenet", "num_classes": 2,
                  "model": trained.state_dict(), "preprocess": {"image_size": 32}}  # fmt: skip
    torch.save(trained.state_dict(), tmp_path / "weights.pth")
    with _TruncatedNormalDraws() as draws:
        rebuilt = model_from_checkpoint(checkpoint)
        from_file = build_model("googlenet", 2, weights=str(tmp_path / "weights.pth"))
        resolve_model("googlenet", weights=str(tmp_path / "weights.pth"))  # --weights FILE
    assert draws.count == 0
    weights = rebuilt.state_dict()  # strictly loaded: every one the file's
    assert all(torch.equal(weights[key], value) for key, value in trained.state_dict().items())
    assert torch.equal(from_file.fc.weight, trained.fc.weight)
    with _TruncatedNormalDraws() as draws:  # the counter sees the initialiser's draws
        torch.nn.init.trunc_normal_(torch.empty(4))
    assert draws.count > 0
