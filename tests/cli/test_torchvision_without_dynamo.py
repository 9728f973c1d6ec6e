"""torchvision imported without torch._dynamo (`torchkit.torchvision_without_dynamo`) and
without torch.onnx (`torchkit.torchvision_without_onnx`): in fresh processes, since this one has
loaded all three."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from image_folders import write_image_folder
from processes import INHERITED
from suite_paths import REPO


def _python(script: str, **env: str) -> list[str]:
    """Run `script` in a fresh Python; its stdout's lines."""
    full_env = {key: value for key, value in os.environ.items() if key not in INHERITED}
    full_env.update(env)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True, text=True, env=full_env, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:-1]


def test_install_adds_the_finder_once_whatever_the_environment(monkeypatch):
    from torchkit import torchvision_without_dynamo as light

    monkeypatch.delitem(sys.modules, "torch._dynamo", raising=False)
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    monkeypatch.setattr(sys, "meta_path", [])
    monkeypatch.setenv("TORCHKIT_LIGHT_TORCHVISION", "0")  # the experiment's old switch: gone
    light.install()
    light.install()
    assert [type(finder).__name__ for finder in sys.meta_path] == ["_Finder"]


TIMM = importlib.util.find_spec("timm") is not None

# A torchvision that asked dynamo for more would only lose the saving; once the real dynamo is
# loaded, install() adds no finder and torchvision imports as it is. Run in a fork of a process
# that has imported torch and nothing else (what a fresh `python -c "import torch; ..."` has),
# so that it costs no torch start-up of its own.
STAND_IN = """
    import sys
    from torchkit import torchvision_without_dynamo as light
    light._place()
    stand_in = sys.modules["torch._dynamo"]
    print(type(stand_in).__name__, light.dynamo_loaded())
    config = stand_in.config
    print(config.__name__, light.missing, type(sys.modules["torch._dynamo"]).__name__)
    print(light.dynamo_loaded(), hasattr(stand_in, "__file__"))
    light.install()
    print(any(type(f).__name__ == "_Finder" for f in sys.meta_path))
    import torchvision.transforms.v2
    print(type(sys.modules["torch._dynamo"]).__name__, light.missing)
    """

# torchkit's CLI module installs the hooks as `python -m torchkit` does; then what train's
# transforms and extract-features' tracer import. torchvision's ONNX symbolics are registered
# as soon as torch.onnx is imported (as export imports it: `torch.onnx.export` through torch's
# lazy attribute), and a name the stand-in lacks imports the real module. Run in a fork taken
# right after `import torch` too (a fresh process of its own cost a torch start-up, 2-4 s):
# importing torch loads neither torchvision nor torch.onnx, and the CLI's hooks are installed
# here before either is imported, as `python -m torchkit` installs them.
WITHOUT_ONNX = """
    import json, sys
    import torchkit.cli
    import torch
    from torchkit import torchvision_without_onnx as light

    def registered():
        try:
            from torch.onnx._internal.torchscript_exporter import registration
        except ImportError:  # older torch
            from torch.onnx._internal import registration
        return [registration.registry.is_registered_op(name, opset) for name, opset in
                (("torchvision::nms", 11), ("torchvision::roi_align", 16),
                 ("torchvision::roi_pool", 11))]

    before = {"onnx before": "torch.onnx" in sys.modules,
              "torchvision before": "torchvision" in sys.modules}
    import torchvision.transforms.v2, torchvision.models.feature_extraction
    report = {**before, "onnx after torchvision": "torch.onnx" in sys.modules,
              "owed": light.registration_owed(),
              "stand-in left": "torchvision.ops._register_onnx_ops" in sys.modules}
    torch.onnx.export  # noqa: B018 (imports torch.onnx)
    report.update({"registered": registered(), "owed after": light.registration_owed(),
                   "asked": light.missing})
    print(json.dumps(report))
    """


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict[str, list[str]]:
    """Whole commands, one after another in one fresh process as `python -m torchkit` runs
    them: the CLI installs the finder before any import of torchvision (the loaders, the
    transforms, torchvision's models). First, the built-in digits with the convnet need no
    torchvision at all: train (AdamW, then SGD), then eval and predict (their crops made without
    it). Then torchvision's other modules and tv_tensors, and timm: timm decorates methods with
    torch.compiler.disable as its modules are imported, which loaded dynamo (about half of
    `import timm`) even for `train --print-config`, which only reads a tag's pretrained config.
    summary's FLOP count runs torch's dispatch modes, whose first calls would import
    torch._dynamo (2 s): under `without_dynamo` they do not, and they count what they count with
    dynamo loaded. Last, the stand-in's is_compile_supported imports the real dynamo when it is
    called, and torch.compile works through the deferred `disable` of tv_tensors.wrap. (One
    process for all: each is a torch start-up; STAND_IN runs in a fork of it taken right after
    `import torch`. matplotlib and scikit-learn are imported first, as the suite's own process
    does, so that the commands draw and score here rather than in a helper process per command,
    which would import them again each time: what a helper imports is no part of this
    process.) The marks of the commands and those of STAND_IN, by name."""
    tmp_path = tmp_path_factory.mktemp("without_dynamo")
    write_image_folder(tmp_path / "ds" / "train", {"a": 4, "b": 4})
    write_image_folder(tmp_path / "ds" / "val", {"a": 2, "b": 2})
    timm = """
        torchkit("train", "--model", "timm/test_vit.r160_in1k", "--print-config", "-o",
                 "/dev/null")
        import timm
        mark("print-config", "timm.models.naflexvit" in sys.modules, loaded(), light.missing)
        model = timm.create_model("test_vit", num_classes=2, img_size=32).eval()
        with torch.no_grad():
            mark("a timm model", tuple(model(torch.randn(2, 3, 32, 32)).shape), loaded())
        """
    lines = _python(
        f"""
        import os, sys
        import torch

        def in_a_fork(name, code, out):
            # `code` run as this script's own lines (its globals) in a fork taken here, with
            # torch imported and nothing else, its stdout the file `out`.
            if (child := os.fork()) == 0:
                try:
                    with open(out, "w") as sys.stdout:
                        exec(code, globals())
                except BaseException:
                    import traceback
                    traceback.print_exc()
                    os._exit(1)
                os._exit(0)
            assert os.waitpid(child, 0)[1] == 0, f"{{name}} failed in its fork"

        in_a_fork("STAND_IN", {textwrap.dedent(STAND_IN)!r}, {str(tmp_path / "stand-in")!r})
        in_a_fork(
            "WITHOUT_ONNX", {textwrap.dedent(WITHOUT_ONNX)!r}, {str(tmp_path / "without-onnx")!r}
        )

        import matplotlib.figure, sklearn.metrics
        os.chdir({str(tmp_path)!r})
        from torchkit.cli import main
        from torchkit import torchvision_without_dynamo as light

        marks = open({str(tmp_path / "marks")!r}, "w", buffering=1)  # stdout has the JSON

        def mark(*words):
            print(*words, file=marks)

        def loaded():
            return "torch._dynamo" in sys.modules

        def torchkit(*args):
            sys.argv = ["python -m torchkit", *args]
            try:
                main()
            except SystemExit as ended:
                assert ended.code in (0, None), (args, ended.code)
            mark(args[0], loaded())

        # batches of 512: three optimiser steps an epoch, each the step a run takes
        torchkit("train", "--data", "digits", "--epochs", "1", "--batch-size", "512", "--out",
                 "digits-run", "--format", "json")
        torchkit("train", "--data", "digits", "--epochs", "1", "--batch-size", "512",
                 "--image-size", "8", "--optimizer", "sgd", "--lr", "0.01", "--out", "digits-sgd",
                 "--format", "json")
        torchkit("eval", "digits-run/best.pt", "--data", "digits", "--format", "json")
        # its held-out test split (179 images): all 1,797 took five times the CPU, the same path
        torchkit("predict", "digits-run/best.pt", "digits", "--split", "test", "--format", "json")
        # image files: their 8-bit eval crops made with PIL alone (importing torchvision took
        # 1-1.5 s of predict's start)
        torchkit("predict", "digits-run/best.pt", "ds/val", "--format", "json", "-j", "0")
        mark("digits", "torchvision" in sys.modules)
        # a checkpoint at another size: its meta-device check imported sympy (2-5 s), and for
        # some models torch._dynamo, until it ran under summary's stand-ins. The convnet's is
        # refused (it is built for 12 px), shufflenet's below fine-tunes.
        sys.argv = ["python -m torchkit", "train", "--model", "digits-run/best.pt",
                    "--image-size", "16", "--out", "digits-16"]
        try:
            main()
        except SystemExit as ended:
            tuned = [(ended.code, loaded(), "sympy" in sys.modules)]
        # a small torchvision model: resnet18's two 134 MB checkpoints took seconds to write
        torchkit("train", "--data", "ds", "--model", "shufflenet_v2_x0_5", "--image-size", "16",
                 "--epochs", "1", "--workers", "0", "--device", "cpu", "--out", "run",
                 "--format", "json")
        torchkit("eval", "run/best.pt", "--data", "ds", "--workers", "0", "--device", "cpu",
                 "--format", "json")
        torchkit("train", "--model", "run/best.pt", "--data", "ds", "--image-size", "24",
                 "--epochs", "1", "--workers", "0", "--device", "cpu", "--out", "run24",
                 "--format", "json")
        tuned.append((0, loaded(), "sympy" in sys.modules))
        with open({str(tmp_path / "fine-tune")!r}, "w") as written:
            print(repr(tuned), file=written)
        mark("torchvision", "torchvision.models" in sys.modules,
             "torchvision.transforms" in sys.modules)

        import torch
        import torchvision
        import torchvision.datasets, torchvision.io, torchvision.models, torchvision.ops
        import torchvision.transforms, torchvision.transforms.v2
        import torchvision.transforms.v2.functional
        from torchvision import tv_tensors
        mark("after the imports", loaded(), light.missing)
        image = tv_tensors.Image(torch.zeros(1, 2, 2))
        wrapped = tv_tensors.wrap(torch.ones(1, 2, 2), like=image)
        mark("wrap", type(wrapped).__name__, loaded())
        resized = torchvision.transforms.v2.Resize(4)(image)
        mark("a v2 transform", tuple(resized.shape), loaded())
        {timm if TIMM else ""}
        from torchkit.core.models.builders import build_model
        from torchkit.core.summary import summarize

        # summary: a named model built on the meta device (its random draws ran torch's
        # references), and an LSTM's meta kernels, asked neither dynamo nor sympy
        def heavy():
            return [name for name in ("sympy", "torch.fx.experimental.symbolic_shapes")
                    if name in sys.modules]

        before = heavy()  # torch before 2.5 loads both as it is imported
        triton_before = "triton" in sys.modules
        torchkit("summary", "resnet18", "--image-size", "32", "--format", "json", "-o",
                 "resnet18.json")
        lstm = summarize(torch.nn.LSTM(8, 16, batch_first=True), [(2, 10, 8)])
        mark("an LSTM", loaded(), lstm.total_mult_adds)
        # FLOP counting imported triton (through torch.utils.flop_counter): not any more
        mark("triton", triton_before, "triton" in sys.modules)
        from torchkit.core.runtime import plain_shapes
        with open({str(tmp_path / "plain-shapes")!r}, "w") as shapes:
            print(repr((before, heavy(), sorted(set(plain_shapes.missing)))), file=shapes)
        model = build_model("convnet", num_classes=10, image_size=28)
        first = summarize(model, [(1, 3, 28, 28)])
        mark("summary", loaded(), first.flops > 0)
        roi_align = sys.modules["torchvision.ops.roi_align"]
        mark("is_compile_supported", roi_align.is_compile_supported("cpu"), loaded())
        from torch._dynamo.utils import is_compile_supported
        mark("the real one", is_compile_supported("cpu"))
        again = summarize(model, [(1, 3, 28, 28)])
        mark("with dynamo", again.flops == first.flops)
        compiled = torch.compile(
            lambda x: tv_tensors.wrap(x * 2, like=image).sum(), backend="eager"
        )
        mark("compiled", float(compiled(torch.ones(1, 2, 2))))
        mark("wrap once dynamo is loaded", type(tv_tensors.wrap(image, like=image)).__name__)
        """
    )
    assert lines
    return {
        "commands": (tmp_path / "marks").read_text().splitlines(),
        "stand-in": (tmp_path / "stand-in").read_text().splitlines(),
        "plain shapes": ast.literal_eval((tmp_path / "plain-shapes").read_text()),
        "fine-tune": ast.literal_eval((tmp_path / "fine-tune").read_text()),
        "without onnx": json.loads((tmp_path / "without-onnx").read_text()),
    }


@pytest.mark.skipif(
    torch.__version__ < "2.15",
    reason="measured on the locked torch: older ones (2.4) import sympy through modules the "
    "stand-ins do not cover (torch.utils._sympy), which loses the saving, nothing else",
)
def test_summary_loads_neither_sympy_nor_symbolic_shapes(one_process):
    """summary of a named model and of an LSTM (above) under `plain_shapes` loads neither module,
    unless this torch's meta kernels asked the stand-ins for a name they lack, which loads the
    real ones: the saving lost, nothing else."""
    before, after, asked = one_process["plain shapes"]
    assert after == before or asked, (before, after, asked)


@pytest.mark.skipif(
    torch.__version__ < "2.15",
    reason="older torch loads sympy as it is imported",
)
def test_train_checks_a_checkpoints_new_image_size_without_sympy_or_dynamo(one_process):
    """`train --model best.pt --image-size N` of a checkpoint trained at another size: the
    meta-device check refuses the digits convnet's 16 px (it is built for 12: exit 2) and lets
    shufflenet's 24 px train, and imports neither sympy nor torch._dynamo (exit code, then
    whether each is loaded)."""
    assert one_process["fine-tune"] == [(2, False, False), (0, False, False)]


def test_a_name_the_stand_ins_lack_comes_from_the_real_dynamo_and_then_nothing_is_done(
    one_process,
):
    assert one_process["stand-in"] == [
        "StandInModule False",
        "torch._dynamo.config ['torch._dynamo.config'] module",
        "True False",
        "False",
        "module ['torch._dynamo.config']",
    ]


def test_torchvision_is_imported_without_torch_onnx_and_registers_its_symbolics_with_it(
    one_process,
):
    assert one_process["without onnx"] == {
        "onnx before": False,
        "torchvision before": False,
        "onnx after torchvision": False,  # 0.3 s of CPU it took
        "owed": True,
        "stand-in left": False,
        "registered": [True, True, True],
        "owed after": False,
        "asked": [],
    }


def test_commands_torchvision_and_timm_never_import_dynamo_and_compiling_still_works(one_process):
    timm_lines = ["train False", "print-config True False []", "a timm model (2, 2) False"]
    assert one_process["commands"] == [
        "train False",
        "train False",  # sgd: the other optimiser step torchkit takes without dynamo
        "eval False",
        "predict False",
        "predict False",  # image files
        "digits False",  # and files: torchvision not imported
        "train False",
        "eval False",
        "train False",  # shufflenet's checkpoint fine-tuned at another size
        "torchvision True True",
        "after the imports False []",
        "wrap Image False",
        "a v2 transform (1, 4, 4) False",
        *(timm_lines if TIMM else []),
        "summary False",
        f"an LSTM False {2 * 10 * (64 * 8 + 64 * 16 + 64 + 64)}",  # 4 gates, 2 x 10 steps
        "triton False False",
        "summary False True",
        "is_compile_supported True True",  # imports the real one when called
        "the real one True",
        "with dynamo True",
        "compiled 8.0",
        "wrap once dynamo is loaded Image",
    ]
