"""One model resolver: the same MODEL [--weights W] means the same model in `summary`,
`extract-features` and `convert-syncbn` (same parameter count, same logits for the same input),
for every kind of spec; plus the user-visible cases of issue #16 (one error line, the JSON
alone on stdout)."""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from image_folders import write_image_folder
from offline import offline_env, unreachable_proxy
from PIL import Image
from processes import run_torchkit_in_process
from safetensors.torch import save_file
from torch import nn

from torchkit.cli import app
from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.data.transforms import eval_transform
from torchkit.core.io.errors import CheckpointError, InputError, UsageError
from torchkit.core.models import ResolvedModel, resolve_model
from torchkit.core.models.checkpoint import FORMAT_VERSION, save_checkpoint
from torchkit.core.models.convnet import convnet_class

PKG = "tk_resolver_pkg"  # the user's package, importable only from the world's folder
NETS = f"""
import torch
from torch import nn

print("hello from {PKG}.nets at import")


class Net(nn.Module):
    def __init__(self, num_classes=4):
        super().__init__()
        print("hello from Net.__init__")
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1)
        )
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))
"""
CONVNET_PREPROCESS = {
    "image_size": 28,
    "resize_size": 28,
    "mean": [0.5, 0.5, 0.5],
    "std": [0.25, 0.25, 0.25],
    "in_channels": 3,
    "interpolation": "bilinear",
}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """Every kind of model file, written from known modules (the truth each spec must give)."""
    root = tmp_path_factory.mktemp("world")
    (root / PKG).mkdir()
    (root / PKG / "__init__.py").write_text("")
    (root / PKG / "nets.py").write_text(NETS)
    write_image_folder(root / "imgs", {"a": 2, "b": 1}, size=32)

    torch.manual_seed(0)
    convnet = convnet_class()(10, 3, 28).eval()
    state = convnet.state_dict()
    torch.save(state, root / "ck.pt")
    torch.save({f"module.{k}": v for k, v in state.items()}, root / "ddp.pt")
    torch.save({f"_orig_mod.{k}": v for k, v in state.items()}, root / "compiled.pt")
    save_file({k: v.contiguous() for k, v in state.items()}, str(root / "ck.safetensors"))
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "arch": "convnet",
            "num_classes": 10,
            "classes": [str(i) for i in range(10)],
            "model": state,
            "preprocess": CONVNET_PREPROCESS,
        },
        root / "tk.pt",
    )

    resnet = torchvision.models.resnet18()
    resnet.fc = nn.Linear(512, 2)
    resnet.eval()
    torch.save(resnet.state_dict(), root / "finetuned_2class.pt")

    sys.path.insert(0, str(root))  # only to build and pickle the truth; removed at once
    try:
        import importlib

        nets = importlib.import_module(f"{PKG}.nets")
        net = nets.Net().eval()
        with torch.no_grad():  # BatchNorm statistics that are not the defaults
            net.features[1].running_mean.uniform_(-1, 1)
            net.features[1].running_var.uniform_(0.5, 2)
        torch.save(net, root / "full.pt")
        torch.save(net.state_dict(), root / "net_sd.pt")
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == PKG or m.startswith(f"{PKG}.")]:
            del sys.modules[name]
    return {"root": root, "convnet": convnet, "resnet": resnet, "net": net}


@pytest.fixture
def in_world(world, monkeypatch):
    """Run in the world's folder, leaving sys.path and sys.modules as they were."""
    monkeypatch.chdir(world["root"])
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    yield world
    for name in [m for m in sys.modules if m == PKG or m.startswith(f"{PKG}.")]:
        del sys.modules[name]


# id: (MODEL, --weights, --trust-checkpoint, the truth, input size C,H,W)
SPECS = {
    "convnet+state_dict": ("convnet", "ck.pt", False, "convnet", (3, 28, 28)),
    "torchkit_checkpoint": ("tk.pt", None, False, "convnet", (3, 28, 28)),
    "convnet+torchkit_checkpoint": ("convnet", "tk.pt", False, "convnet", (3, 28, 28)),
    "convnet+module_prefix": ("convnet", "ddp.pt", False, "convnet", (3, 28, 28)),
    "convnet+orig_mod_prefix": ("convnet", "compiled.pt", False, "convnet", (3, 28, 28)),
    "convnet+safetensors": ("convnet", "ck.safetensors", False, "convnet", (3, 28, 28)),
    "pickled_module+trust": ("full.pt", None, True, "net", (3, 32, 32)),
    "callable+state_dict": (f"{PKG}.nets:Net", "net_sd.pt", False, "net", (3, 32, 32)),
    "callable+pickled_weights+trust": (f"{PKG}.nets:Net", "full.pt", True, "net", (3, 32, 32)),
    "resnet18+finetuned_2class": ("resnet18", "finetuned_2class.pt", False, "resnet", (3, 32, 32)),
}


def options(weights: str | None, trust: bool) -> list[str]:
    return [
        *(["--weights", weights] if weights else []),
        *(["--trust-checkpoint"] if trust else []),
    ]


def resolve(case: str) -> ResolvedModel:
    spec, weights, trust, _, _ = SPECS[case]
    return resolve_model(spec, weights=weights, trust_checkpoint=trust)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("case", SPECS)
def test_resolve_model_gives_the_saved_model(in_world, case):
    truth = in_world[SPECS[case][3]]
    resolved = resolve(case)
    x = torch.randn(2, *SPECS[case][4], generator=torch.Generator().manual_seed(1))
    assert n_params(resolved.model) == n_params(truth)
    with torch.no_grad():
        torch.testing.assert_close(resolved.model.eval()(x), truth(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("case", SPECS)
def test_summary_counts_the_same_parameters(in_world, runner, case):
    spec, weights, trust, truth, size = SPECS[case]
    result = runner.invoke(
        app,
        ["summary", spec, *options(weights, trust), "-i", ",".join(map(str, size)), "--no-flops"]
        + ["--format", "json"],
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["totals"]["total_params"] == n_params(in_world[truth])


@pytest.mark.parametrize("case", SPECS)
def test_extract_features_gives_the_same_logits(in_world, runner, tmp_path, case):
    spec, weights, trust, truth, _ = SPECS[case]
    out = tmp_path / "out"
    args = ["extract-features", spec, "imgs", str(out), "-l", "logits", "-j", "0"]
    if SPECS[case][4][1] != 28:
        args += ["--image-size", "32", "--resize-size", "32"]  # keep resnet18 fast
    result = runner.invoke(app, [*args, *options(weights, trust), "--device", "cpu"])
    assert result.exit_code == 0, result.stderr
    meta = json.loads((out / "meta.json").read_text())
    transform = eval_transform(Preprocess.from_dict(meta["preprocess"]))
    paths = sorted(str(p.relative_to("imgs")) for p in Path("imgs").rglob("*.png"))
    x = torch.stack([transform(Image.open(Path("imgs") / p).convert("RGB")) for p in paths])
    with torch.no_grad():
        expected = in_world[truth](x)
    np.testing.assert_allclose(np.load(out / "logits.npy"), expected.numpy(), atol=1e-5)


@pytest.mark.parametrize("case", SPECS)
def test_convert_syncbn_sees_the_same_model(in_world, runner, case):
    spec, weights, trust, truth, _ = SPECS[case]
    result = runner.invoke(
        app, ["convert-syncbn", spec, *options(weights, trust), "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr
    batchnorms = [m for m in in_world[truth].modules() if isinstance(m, nn.BatchNorm2d)]
    assert json.loads(result.stdout)["count"] == len(batchnorms)


@pytest.mark.parametrize("case", SPECS)
def test_eval_scores_the_same_logits(in_world, runner, case):
    """eval's loss and predictions are those of the truth on the same preprocessed images."""
    spec, weights, trust, truth, _ = SPECS[case]
    model = in_world[truth]
    outputs = model.fc.out_features if hasattr(model, "fc") else 10
    names = ["a", "b", *(f"c{i}" for i in range(2, outputs))]  # imgs/ holds a/ and b/
    args = ["eval", spec, *options(weights, trust), "--data", "imgs", "--classes", ",".join(names)]
    if SPECS[case][4][1] != 28:
        args += ["--image-size", "32", "--resize-size", "32"]
    result = runner.invoke(app, [*args, "-j", "0", "--device", "cpu", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    transform = eval_transform(Preprocess.from_dict(data["preprocess"]))
    paths = sorted(Path("imgs").rglob("*.png"))
    x = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths])
    labels = torch.tensor([names.index(p.parent.name) for p in paths])
    with torch.no_grad():
        logits = model(x)
    loss = float(nn.functional.cross_entropy(logits, labels))
    assert data["loss"] == pytest.approx(loss, abs=1e-5)
    assert data["accuracy"] == pytest.approx(float((logits.argmax(1) == labels).double().mean()))


TRAINABLE = [case for case in SPECS if case != "pickled_module+trust"]


@pytest.fixture(scope="module")
def train_data(world) -> Path:
    root = world["root"] / "trainset"
    for split, count in (("train", 2), ("val", 1)):
        write_image_folder(root / split, {"a": count, "b": count}, size=32, seed=len(split))
    return root


@pytest.mark.parametrize("case", TRAINABLE)
def test_train_starts_from_the_same_weights(in_world, runner, train_data, tmp_path, case):
    """train MODEL [--weights W] --freeze-backbone: the backbone it saves is the truth's, its
    parameter count the truth's with a 2-class head."""
    from torchkit.core.models import find_head
    from torchkit.core.models.checkpoint import load_checkpoint

    spec, weights, trust, truth, size = SPECS[case]
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        ["train", "--data", str(train_data), "--model", spec, *options(weights, trust)]
        + ["--freeze-backbone", "--epochs", "1", "--batch-size", "2", "--image-size", str(size[1])]
        + ["--resize-size", str(size[1]), "-j", "0", "--device", "cpu", "--out", str(out)],
    )
    assert result.exit_code == 0, result.stderr
    saved = load_checkpoint(out / "last.pt")
    reference = in_world[truth]
    head_name, head = find_head(reference)
    expected = n_params(reference) - n_params(head) + head.in_features * 2 + 2
    assert (
        sum(
            v.numel()
            for k, v in saved["model"].items()
            if "running" not in k and "num_batches" not in k
        )
        == expected
    )
    for key, value in reference.state_dict().items():
        if not key.startswith(head_name + "."):
            torch.testing.assert_close(saved["model"][key], value, rtol=0, atol=0)


def test_train_refuses_a_pickled_model_it_cannot_rebuild(in_world, runner, train_data, tmp_path):
    result = runner.invoke(
        app,
        ["train", "--data", str(train_data), "--model", "full.pt", "--trust-checkpoint"]
        + ["--epochs", "1", "--workers", "0", "--out", str(tmp_path / "run")],
    )
    assert result.exit_code == 2
    assert "full.pt is a pickled model" in result.stderr and "--weights" in result.stderr
    assert not (tmp_path / "run" / "last.pt").exists()


def test_the_head_is_sized_from_the_weights(in_world):
    resolved = resolve_model("resnet18", weights="finetuned_2class.pt")
    assert resolved.model.fc.out_features == 2
    assert n_params(resolved.model) == 11_177_538
    # Another class count replaces the head only when asked to (fine-tuning, as train does);
    # otherwise a random head would be used as if the weights had trained it.
    tuned = resolve_model("resnet18", weights="finetuned_2class.pt", num_classes=5, new_head=True)
    assert tuned.model.fc.out_features == 5 and tuned.classes is None
    with pytest.raises(UsageError, match=r"5 classes asked for .* state dict has 2 outputs") as e:
        resolve_model("resnet18", weights="finetuned_2class.pt", num_classes=5)
    # Only the options given are named (export takes no --classes, predict no --num-classes).
    assert e.value.message == (
        "5 classes asked for (--num-classes), but the state dict has 2 outputs"
    )
    assert e.value.hint == "drop --num-classes"
    with pytest.raises(UsageError) as e:
        resolve_model("resnet18", weights="finetuned_2class.pt", classes=["a", "b", "c"])
    assert e.value.message == "3 classes asked for (--classes), but the state dict has 2 outputs"
    assert e.value.hint == "drop --classes, or give 2 class names, one per output of the weights"


@pytest.mark.parametrize(("spec", "weights"), [("full.pt", None), (f"{PKG}.nets:Net", "full.pt")])
def test_a_pickled_module_needs_trust_wherever_it_is_loaded(in_world, spec, weights):
    with pytest.raises(CheckpointError, match="--trust-checkpoint"):
        resolve_model(spec, weights=weights)


# -- what the user sees: with the working directory off sys.path, as for the installed
#    `torchkit` (`python -m` would make it importable by itself); in this process, whose
#    sys.stdout and sys.stderr the runner keeps apart as a real process's are ---------------


def test_summary_of_a_printing_callable_keeps_json_on_stdout(in_world):
    # What the module and the callable print goes through sys.stdout, which the command points
    # at stderr (console.results_only_on_stdout) in this process as in a real one.
    world = in_world
    result = run_torchkit_in_process(
        "summary", f"{PKG}.nets:Net", "-i", "3,8,8", "--format", "json", "--no-flops",
        cwd=world["root"],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)  # nothing but the JSON
    assert data["totals"]["total_params"] == n_params(world["net"])
    assert "hello from" not in result.stdout
    assert "at import" in result.stderr and "Net.__init__" in result.stderr


FORWARD_PRINTS = """
import torch


class Chatty(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x):
        print("hello from forward")
        return self.linear(x)
"""


@pytest.mark.parametrize(
    "args",
    [
        ["summary", "chatty:Chatty", "-i", "4"],
        ["benchmark", "chatty:Chatty", "-i", "4", "--iters", "1", "--warmup", "0"],
        ["export", "chatty:Chatty", "chatty.ts", "--image-size", "4"],  # the quickest format
    ],
    ids=["summary", "benchmark", "export"],
)
def test_what_a_models_forward_prints_goes_to_stderr_not_into_the_json(tmp_path, args):
    """Before: prints while the model ran (not while it was imported and built) went to
    stdout, ahead of the JSON."""
    (tmp_path / "chatty.py").write_text(FORWARD_PRINTS)
    result = run_torchkit_in_process(*args, "--format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)  # nothing but the JSON
    assert "hello from forward" in result.stderr


@pytest.mark.parametrize(
    ("code", "spec", "exit_code", "message"),
    [
        ("def make():\n    raise SystemExit(0)\n", "quits_when_called:make", 1, "sys.exit(0)"),
        ("import sys\nsys.exit(3)\n", "quits_at_import:make", 1, "sys.exit(3)"),
        ("def make():\n    pass\n", "../here/by_path:make", 2, "is a path, not a module name"),
        (
            "def make(size):\n    return size\n",
            "needs_args:make",
            1,
            "Error: needs_args:make could not build a model: TypeError: make() missing 1 "
            "required positional argument: 'size' (fix the callable, or set TORCHKIT_DEBUG=1",
        ),
    ],
    ids=["exit-0-when-called", "exit-3-at-import", "a-relative-path", "a-failing-callable"],
)
def test_model_code_that_exits_or_a_path_as_module_is_one_error_line(
    tmp_path, code, spec, exit_code, message
):
    """Before: SystemExit(0) in the model's code ended the command with exit 0 and no output,
    `../here/quits:make` was a TypeError from importlib, and a callable that failed was an
    internal error that did not say it was the model's code."""
    here = tmp_path / "here"
    here.mkdir()
    (here / f"{spec.split(':')[0].rsplit('/')[-1]}.py").write_text(code)  # one module a case
    result = run_torchkit_in_process("summary", spec, "-i", "2", cwd=here)
    assert result.returncode == exit_code, result.stderr
    assert result.stderr.startswith("Error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""


def test_a_file_name_as_module_is_hinted_as_the_module_name(tmp_path):
    """Before: `oddnets.py:Shared`, run beside oddnets.py, hinted to run torchkit from the
    folder that holds oddnets.py, which it already was."""
    (tmp_path / "oddnets.py").write_text("def Shared():\n    pass\n")
    result = run_torchkit_in_process("summary", "oddnets.py:Shared", "-i", "2", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("Error: cannot import model 'oddnets.py:Shared'")
    assert result.stderr.strip().endswith("(name the module without .py: oddnets:Shared)")


def test_summary_sizes_the_head_from_the_weights_and_trust_reaches_weights(in_world, runner):
    summary = ["summary", "-i", "3,32,32", "--format", "json", "--no-flops"]
    result = runner.invoke(app, [*summary, "resnet18", "--weights", "finetuned_2class.pt"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["totals"]["total_params"] == 11_177_538
    trusted = runner.invoke(
        app, [*summary, f"{PKG}.nets:Net", "--weights", "full.pt", "--trust-checkpoint"]
    )
    assert trusted.exit_code == 0, trusted.stderr


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["nosuchpkg.mod:Net"], 2, "cannot import model"),
        (["resnet81"], 2, "unknown model 'resnet81'"),
        (["full.pt"], 1, "--trust-checkpoint"),
        (["convnet", "--weights", "full.pt"], 1, "--trust-checkpoint"),
        (["ck.pt"], 2, "MODEL --weights ck.pt"),
    ],
)
def test_bad_specs_are_one_error_line(in_world, args, code, message):
    result = run_torchkit_in_process("summary", *args, "--format", "json", cwd=in_world["root"])
    assert result.returncode == code
    assert result.stdout == ""
    assert result.stderr.startswith("Error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["missing.onnx", "missing.ts", "missing.pt2"])
def test_a_missing_exported_file_is_a_missing_file_not_an_unknown_name(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)  # a bare file name, as typed: not taken for a model name
    with pytest.raises(InputError, match="not found"):
        resolve_model(name)


def small_convnet_checkpoint(path: Path) -> nn.Module:
    """A torchkit checkpoint of a convnet trained at 12 px (its classifier is sized for that)."""
    torch.manual_seed(0)
    model = convnet_class()(10, 3, 12).eval()
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "arch": "convnet",
            "num_classes": 10,
            "model": model.state_dict(),
            "preprocess": {**CONVNET_PREPROCESS, "image_size": 12, "resize_size": 12},
        },
        path,
    )
    return model


def test_a_name_with_a_checkpoint_as_weights_is_built_for_the_recorded_size(runner, tmp_path):
    """`convnet --weights best.pt` is the model `best.pt` alone gives, whatever size it was
    trained at (it was built for 28 px, and the weights did not fit)."""
    truth = small_convnet_checkpoint(tmp_path / "tk12.pt")
    named = resolve_model("convnet", weights=str(tmp_path / "tk12.pt"))
    assert named.sample_shape == (3, 12, 12)
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        assert torch.equal(named.model.eval()(x), truth(x))
    result = runner.invoke(
        app, ["summary", "convnet", "--weights", str(tmp_path / "tk12.pt"), "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["totals"]["total_params"] == n_params(truth)
    assert data["input_shapes"] == [[1, 3, 12, 12]]


@pytest.mark.parametrize(
    ("weights", "image_size", "expected"),
    [("sd.pt", 32, (32, 32)), ("tk.pt", None, (48, 48)), ("sd.pt", None, (224, 224))],
)
def test_a_vit_with_a_weights_file_is_built_for_its_size(
    tmp_path, monkeypatch, weights, image_size, expected
):
    """A ViT's position embeddings fix its image size: with a weights file it is built for
    --image-size, else the size a torchkit checkpoint records (it was always 224)."""
    from torchkit.core.models import resolver

    torch.save({"w": torch.zeros(1)}, tmp_path / "sd.pt")
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "arch": "vit_b_16",
            "num_classes": 3,
            "model": {"w": torch.zeros(1)},
            "preprocess": {**CONVNET_PREPROCESS, "image_size": 48, "resize_size": 48},
        },
        tmp_path / "tk.pt",
    )
    built = []

    def record_size(name, num_classes, size, **_):
        built.append(size)
        raise UsageError("stop here")  # the 86M-parameter model itself is not needed

    monkeypatch.setattr(resolver, "torchvision_random", record_size)
    with pytest.raises(UsageError, match="stop here"):
        resolve_model("vit_b_16", weights=str(tmp_path / weights), image_size=image_size)
    assert [tuple(size) for size in built] == [expected]


@pytest.mark.parametrize("command", ["summary", "benchmark", "convert-syncbn"])
def test_a_checkpoint_whose_preprocessing_is_not_a_table_is_a_checkpoint_error(
    runner, tmp_path, command
):
    """A damaged `preprocess` entry (a string) names the file and the entry, not an
    AttributeError from torchkit's code."""
    path = tmp_path / "damaged.pt"
    state = convnet_class()(10, 3, 28).state_dict()
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "arch": "convnet",
            "num_classes": 10,
            "model": state,
            "preprocess": "junk",
        },
        path,
    )
    result = runner.invoke(app, [command, str(path)])
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"Error: the preprocessing recorded in {path} is unusable: it is a str, not a table"
    ), result.stderr
    assert "AttributeError" not in result.stderr


def test_mnasnet_weights_without_module_versions_load(tmp_path):
    """train saves the weights as a plain dict and safetensors keep no per-module versions:
    torchvision's MNASNet refused them ("version should be set to 1 or 2"), so a trained
    mnasnet's best.pt failed at the end of train and in every command, EMA weights too."""
    from torchkit.core.train.ema import ModelEMA

    model = torchvision.models.mnasnet0_5(num_classes=2)
    weights = {name: value.clone() for name, value in model.state_dict().items()}
    checkpoint = tmp_path / "best.pt"
    save_checkpoint(
        {
            "format_version": FORMAT_VERSION,
            "arch": "mnasnet0_5",
            "num_classes": 2,
            "classes": ["a", "b"],
            "model": weights,
            "preprocess": {"image_size": 32},
        },
        checkpoint,
    )
    save_file(weights, tmp_path / "weights.safetensors")
    for resolved in (
        resolve_model(str(checkpoint)),
        resolve_model("mnasnet0_5", weights=str(tmp_path / "weights.safetensors")),
    ):
        assert torch.equal(resolved.model.classifier[1].weight, model.classifier[1].weight)
    ema = ModelEMA(torchvision.models.mnasnet0_5(num_classes=2))
    ema.load_state_dict(weights, updates=3)
    assert torch.equal(ema.module.classifier[1].weight, model.classifier[1].weight)


def test_a_size_maxvit_cannot_take_is_one_error_line():
    result = run_torchkit_in_process("summary", "maxvit_t", "--image-size", "8")
    assert result.returncode == 2
    assert result.stderr.startswith("Error: cannot build maxvit_t for 8x8 images: Input size")
    assert result.stderr.count("\n") == 1 and "block input sizes" in result.stderr


@pytest.mark.parametrize("arch", ["googlenet", "inception_v3"])
def test_auxiliary_heads_follow_a_new_head_count_and_the_weights_shapes(arch):
    """replace_head and fit_head_to resized `fc` only: googlenet's `aux1.fc2`/`aux2.fc2` and
    inception's `AuxLogits.fc` kept 1000 outputs under `--weights DEFAULT` and a new class
    count, and a 2-class run's weights did not fit `NAME --weights FILE` (shape mismatches)."""
    from torchkit.core.models.heads import fit_head_to, replace_head
    from torchkit.core.models.random_init import skipped_weight_init

    # Shapes are what is checked: no random values drawn (most of inception_v3's build).
    with skipped_weight_init():
        pretrained = torchvision.models.get_model(arch, init_weights=False)  # DEFAULT's 1000
        replace_head(pretrained, 2)
        named = torchvision.models.get_model(arch, init_weights=False)  # as NAME --weights does
    aux = {"googlenet": ["aux1.fc2", "aux2.fc2"], "inception_v3": ["AuxLogits.fc"]}[arch]
    assert [pretrained.get_submodule(name).out_features for name in aux] == [2] * len(aux)
    fit_head_to(named, pretrained.state_dict())
    named.load_state_dict(pretrained.state_dict())


def test_a_googlenet_checkpoint_without_aux_heads_rebuilds():
    """A run trained from googlenet's torchvision weights (which have no auxiliary heads)
    saved none: `eval RUN/best.pt` failed with "18 missing keys (first: aux1.conv...)"."""
    from torchkit.core.models import model_from_checkpoint
    from torchkit.core.models.random_init import skipped_weight_init

    with skipped_weight_init():  # its keys are what is checked, not its values
        trained = torchvision.models.get_model("googlenet", num_classes=2, init_weights=False)
    trained.aux_logits, trained.aux1, trained.aux2 = False, None, None
    checkpoint = {
        "format_version": FORMAT_VERSION,
        "arch": "googlenet",
        "num_classes": 2,
        "model": trained.state_dict(),
        "preprocess": {**CONVNET_PREPROCESS, "image_size": 32, "resize_size": 32},
    }
    with warnings.catch_warnings():
        # torchvision's "default weight initialization ... will be changed" reached the user's
        # terminal whenever torchkit built googlenet or inception_v3
        warnings.simplefilter("error", FutureWarning)
        model = model_from_checkpoint(checkpoint)
    assert model.aux1 is None and not model.aux_logits


def test_a_googlenet_run_from_weights_without_aux_heads_loads_everywhere(
    runner, train_data, tmp_path
):
    """torchvision's pretrained googlenet has no auxiliary heads: training from weights like
    its own failed ("18 missing keys (first: aux1.conv.conv.weight)"), and so did `eval
    googlenet --weights RUN/best.pt` and `--resume` of a run trained from `--weights DEFAULT`.
    They are dropped as torchvision drops them."""
    pretrained = torchvision.models.get_model("googlenet", init_weights=False)
    pretrained.aux1 = pretrained.aux2 = None  # what torchvision's googlenet(weights=...) does
    torch.save(pretrained.state_dict(), tmp_path / "no_aux.pt")
    out = tmp_path / "run"
    trained = run_torchkit_in_process(
        "train", "--data", train_data, "--model", "googlenet", "--weights", tmp_path / "no_aux.pt",
        "--image-size", "32", "--epochs", "1", "--batch-size", "2", "-j", "0", "--device", "cpu",
        "--out", out,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    scored = run_torchkit_in_process(
        "eval", "googlenet", "--weights", out / "best.pt", "--data", train_data, "-j", "0",
        "--device", "cpu",
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr
    resumed = run_torchkit_in_process(
        "train", "--resume", out, "--epochs", "2", "-j", "0", "--device", "cpu"
    )
    assert resumed.returncode == 0, resumed.stderr


def _torchvisions_weights_offline(monkeypatch, tmp_path, arch: str) -> None:
    """torchvision's own builder with its DEFAULT weights (it sets `transform_input=True`), the
    weights a hand-made state dict with its auxiliary heads, as torchvision's file has them,
    "downloaded" into an empty cache from a server that answers."""
    import torchvision.models._api as api

    from torchkit.core.models import hub_cache

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))
    monkeypatch.setattr(hub_cache, "_unreachable", lambda url: None)
    if arch not in _HAND_MADE_WEIGHTS:
        _HAND_MADE_WEIGHTS[arch] = _hand_made_weights(arch)
    state = _HAND_MADE_WEIGHTS[arch]  # never handed out itself: each "download" is a copy
    monkeypatch.setattr(
        api, "load_state_dict_from_url", lambda *_, **__: {k: v.clone() for k, v in state.items()}
    )


# arch -> its hand-made weights, made once for the module's tests (a googlenet's build and
# forward pass cost about 0.4 s of CPU, an inception_v3's more)
_HAND_MADE_WEIGHTS: dict[str, dict] = {}


def _hand_made_weights(arch: str) -> dict:
    torch.manual_seed(0)
    source = torchvision.models.get_model(
        arch, aux_logits=True, transform_input=True, init_weights=False
    )
    # BatchNorm statistics of real activations, not the defaults: with these the outputs of
    # the deep nets depend on their input (they are constant with the defaults).
    batch_norms = [module for module in source.modules() if isinstance(module, nn.BatchNorm2d)]
    for module in batch_norms:
        module.momentum = None  # the plain average of what it sees
    aux = source.AuxLogits if arch == "inception_v3" else None
    if aux is not None:
        source.AuxLogits = None  # it needs larger images than these
    with torch.no_grad():
        source.train()(torch.rand(2, 3, *(2 * [80 if arch == "inception_v3" else 48])))
    if aux is not None:
        source.AuxLogits = aux
    return source.state_dict()


@pytest.mark.parametrize(("arch", "size"), [("googlenet", 48), ("inception_v3", 80)])
def test_googlenet_and_inception_default_weights_answer_as_torchvisions_pipeline(
    monkeypatch, tmp_path, arch, size
):
    """`eval googlenet --weights DEFAULT`: torchvision's documented pipeline (its weights'
    transforms, then its model, which re-normalises with `transform_input`) and torchkit's (the
    same resize and crop, mean/std 0.5, a model without `transform_input`, as every command
    rebuilds one from a checkpoint) give the same outputs."""
    _torchvisions_weights_offline(monkeypatch, tmp_path, arch)
    truth = torchvision.models.get_model(arch, weights="DEFAULT").eval()
    assert truth.transform_input
    resolved = resolve_model(arch, weights="DEFAULT")
    assert not resolved.model.transform_input
    documented = torchvision.models.get_model_weights(arch).DEFAULT.transforms()
    preprocess = resolved.preprocess
    assert (preprocess.resize_size, preprocess.image_size) == (
        documented.resize_size[0],
        documented.crop_size[0],
    )
    assert preprocess.interpolation == documented.interpolation.value
    pixels = torch.rand(2, 3, size, size)
    ours = torchvision.transforms.Normalize(preprocess.mean, preprocess.std)
    theirs = torchvision.transforms.Normalize(documented.mean, documented.std)
    with torch.no_grad():
        expected = truth(theirs(pixels))
        assert not torch.allclose(expected[0], expected[1])  # outputs that tell inputs apart
        # The same up to rounding (the re-normalisation rounds otherwise than Normalize).
        got = resolved.model.eval()(ours(pixels))
        scale = float(expected.abs().max())
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-3 * scale)


def test_default_weights_are_loaded_into_a_model_built_without_random_init(monkeypatch, tmp_path):
    """`--weights DEFAULT`: torchvision's builder loads every weight right after building, so
    the random initialisation it drew first (most of a large model's build) only cost time.
    Skipped now, and the model still holds exactly the weights' values."""
    _torchvisions_weights_offline(monkeypatch, tmp_path, "googlenet")
    drawn = []
    kaiming = nn.init.kaiming_uniform_  # what Conv2d's and Linear's reset_parameters draw with
    monkeypatch.setattr(
        nn.init, "kaiming_uniform_", lambda *a, **k: drawn.append(1) or kaiming(*a, **k)
    )
    resolved = resolve_model("googlenet", weights="DEFAULT")
    assert drawn == []
    state = resolved.model.state_dict()
    for key, value in _HAND_MADE_WEIGHTS["googlenet"].items():
        if not key.startswith("aux"):  # torchvision drops the auxiliary heads after loading
            assert torch.equal(state[key], value), key


def test_a_googlenet_run_from_default_weights_rebuilds_the_model_it_trained(
    monkeypatch, train_data, tmp_path
):
    """`train --model googlenet --weights DEFAULT` trained a model with torchvision's
    `transform_input=True`, while eval, predict, export and --resume rebuild best.pt without it:
    they silently fed the weights other inputs than training did. Training now feeds mean/std
    0.5 to a model without it, records that, and best.pt rebuilds the model it trained."""
    from torchkit.core.models.checkpoint import load_checkpoint
    from torchkit.core.train import setup

    _torchvisions_weights_offline(monkeypatch, tmp_path, "googlenet")
    built = []
    build = setup._build_model
    monkeypatch.setattr(
        setup, "_build_model", lambda *a, **k: built.append(build(*a, **k)) or built[-1]
    )
    out = tmp_path / "run"
    trained = run_torchkit_in_process(
        "train", "--data", train_data, "--model", "googlenet", "--weights", "DEFAULT",
        "--image-size", "32", "--epochs", "1", "--batch-size", "2", "-j", "0", "--device", "cpu",
        "--out", out,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    checkpoint = load_checkpoint(out / "best.pt")
    assert checkpoint["preprocess"]["mean"] == checkpoint["preprocess"]["std"] == [0.5] * 3
    rebuilt = resolve_model(str(out / "best.pt"))  # as eval, predict and export rebuild it
    pixels = torch.rand(2, 3, 32, 32)
    normalize = torchvision.transforms.Normalize(rebuilt.preprocess.mean, rebuilt.preprocess.std)
    with torch.no_grad():
        expected = built[0][0].eval()(normalize(pixels))
        assert not torch.allclose(expected[0], expected[1])  # outputs that tell inputs apart
        torch.testing.assert_close(rebuilt.model.eval()(normalize(pixels)), expected)


def test_train_normalises_as_torchvisions_googlenet_weights_expect(monkeypatch):
    """train's default --mean/--std for googlenet and inception_v3 from torchvision's weights
    (named, or its file) are those weights' (0.5); a --mean or --std given stays the user's."""
    from torchkit.core.data.preprocessing import IMAGENET_MEAN, IMAGENET_STD
    from torchkit.core.models import builders
    from torchkit.core.train.config import TrainConfig
    from torchkit.core.train.validation import resolve_defaults

    def mean_std(**options):
        config = resolve_defaults(TrainConfig(data="images", **options), is_digits=False)
        return config.mean, config.std

    half = (0.5, 0.5, 0.5)
    assert mean_std(model="googlenet", weights="DEFAULT") == (half, half)
    assert mean_std(model="inception_v3", weights="IMAGENET1K_V1") == (half, half)
    assert mean_std(model="googlenet", weights="DEFAULT", mean=(0.4,)) == ((0.4,) * 3, half)
    assert mean_std(model="googlenet") == (IMAGENET_MEAN, IMAGENET_STD)
    assert mean_std(model="resnet18", weights="DEFAULT") == (IMAGENET_MEAN, IMAGENET_STD)
    monkeypatch.setattr(builders, "is_torchvision_transform_input_file", lambda *_: True)
    assert mean_std(model="googlenet", weights=__file__) == (half, half)


def test_a_weights_cache_that_cannot_be_made_is_named_not_taken_for_offline(tmp_path, monkeypatch):
    # TORCH_HOME (or a home) torch.hub cannot make its cache in: "cannot download the DEFAULT
    # weights ... (connect to the internet once ...)", or "Error: FileNotFoundError: ...".
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TORCH_HOME", str(blocker / "torch"))
    done = run_torchkit_in_process("summary", "resnet18", "--weights", "DEFAULT")
    assert done.returncode == 1, done.stderr
    cache = blocker / "torch" / "hub" / "checkpoints"
    assert done.stderr.splitlines()[-1] == (
        f"Error: cannot write the weights cache {cache}: Not a directory (set TORCH_HOME to a "
        "folder torchkit may write, or pass --weights PATH to a local file)"
    )


SQUEEZENET_URL = torchvision.models.SqueezeNet1_1_Weights.DEFAULT.url


def offline_here(monkeypatch: pytest.MonkeyPatch, proxy: str, home: Path) -> None:
    """`offline_env` for this process: urllib's shared opener, which read the proxies of the
    environment when it was made, is made again from these (as in a process starting now)."""
    import urllib.request

    for name, value in offline_env(proxy, home).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(urllib.request, "_opener", None)


def test_default_weights_offline_are_one_error_line_and_no_download_started(tmp_path, monkeypatch):
    # torch.hub printed `Downloading: "https://..."` first: a download seemed to start.
    with unreachable_proxy() as proxy:
        offline_here(monkeypatch, proxy, tmp_path)
        done = run_torchkit_in_process("summary", "squeezenet1_1", "--weights", "DEFAULT")
    assert done.returncode == 1 and done.stdout == ""
    cache = tmp_path / "torch" / "hub" / "checkpoints"
    assert done.stderr.splitlines() == [
        "Error: cannot download the DEFAULT weights of squeezenet1_1: download.pytorch.org "
        "cannot be reached ([Errno 111] Connection refused) (connect to the internet once, or "
        f"save {SQUEEZENET_URL} in the weights cache {cache}; or pass --weights PATH to a "
        "local file)"
    ]
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # nothing half-written


def test_default_weights_in_torch_hubs_cache_are_read_with_no_network(tmp_path, monkeypatch):
    torch.manual_seed(0)
    weights = torchvision.models.squeezenet1_1().state_dict()
    cache = tmp_path / "torch" / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    torch.save(weights, cache / Path(SQUEEZENET_URL).name)
    with unreachable_proxy() as proxy:
        offline_here(monkeypatch, proxy, tmp_path)
        resolved = resolve_model("squeezenet1_1", weights="DEFAULT")
        args = ["squeezenet1_1", "--weights", "DEFAULT", "-i", "3,64,64", "--depth", "0"]
        done = run_torchkit_in_process("summary", *args, "--no-flops", "--format", "json")
    assert resolved.weights_source == "torchvision weights" and len(resolved.classes) == 1000
    for key, value in resolved.model.state_dict().items():
        assert torch.equal(value, weights[key]), key
    assert done.returncode == 0 and done.stderr == ""
    assert json.loads(done.stdout)["totals"]["total_params"] == 1_235_496


def test_a_damaged_cached_weights_file_is_named(tmp_path, monkeypatch):
    """A file in torch.hub's cache cut short (a download copied by hand, as the offline hint
    says to): before -> 'Error: RuntimeError: PytorchStreamReader failed reading zip archive:
    not a ZIP archive...', no path. Its name's SHA-256 prefix says it is not the file."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    cached = tmp_path / "torch" / "hub" / "checkpoints" / SQUEEZENET_URL.rsplit("/", 1)[-1]
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"PK\x03\x04cut short")
    done = run_torchkit_in_process("summary", "squeezenet1_1", "--weights", "DEFAULT")
    assert done.returncode == 1 and done.stdout == ""
    prefix = cached.name.rsplit("-", 1)[-1].split(".")[0]
    assert done.stderr.splitlines() == [
        f"Error: the cached file of the DEFAULT weights of squeezenet1_1 is damaged: {cached} "
        f"(its SHA-256 does not begin with {prefix}, as its name says) (delete it so that it is "
        f"downloaded again, or save {SQUEEZENET_URL} there whole)"
    ]
    assert cached.read_bytes() == b"PK\x03\x04cut short"
