"""A model whose every weight is loaded right after, strictly (a checkpoint, `--weights FILE`) is
built without its random initialisation, and is still exactly the model a normal build loaded
with the same weights: parameters, persistent and non-persistent buffers, outputs."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from torchkit.core.models import resolve_model
from torchkit.core.models.builders import build_model, model_from_checkpoint
from torchkit.core.models.checkpoint import load_weights_into
from torchkit.core.models.random_init import built_for_loading, skipped_weight_init

# (arch, image size): the digits convnet, a torchvision network, a timm one whose
# non-persistent buffers (attention bias indices) its constructor computes, two initialised with
# timm's own truncated normal (`trunc_normal_`, `trunc_normal_tf_`), and an EfficientNet.
MODELS = [
    ("convnet", 8),
    ("resnet18", 32),
    ("timm/levit_128s", 64),  # any size computes them: 64 px is a twelfth of 224's work
    ("timm/test_vit", 64),
    ("timm/test_convnext", 160),
    ("timm/test_efficientnet", 160),  # a squeeze-excite layer made and dropped
]


class _RandomDraws(torch.overrides.TorchFunctionMode):
    """Counts the random draws (`normal_`, `uniform_`) torch's initialisers make, and the
    `erfinv_` timm's truncated normal turns a uniform draw into a normal one with."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", "") in ("normal_", "uniform_", "erfinv_")
        return func(*args, **(kwargs or {}))


def _needs(arch: str) -> None:
    if arch.startswith("timm/") and importlib.util.find_spec("timm") is None:
        pytest.skip("timm is not installed")


@pytest.mark.parametrize(("arch", "size"), MODELS)
def test_a_checkpoints_model_is_built_without_random_draws_and_is_the_same(arch, size):
    _needs(arch)
    torch.manual_seed(0)
    trained = build_model(arch, 3, image_size=size).eval()
    checkpoint = {"format_version": 2, "arch": arch, "num_classes": 3,
                  "model": trained.state_dict(), "preprocess": {"image_size": size}}  # fmt: skip
    with _RandomDraws() as draws:
        rebuilt = model_from_checkpoint(checkpoint).eval()
    assert draws.count == 0
    reference = build_model(arch, 3, image_size=size)  # built as ever, then loaded
    load_weights_into(reference, trained.state_dict())
    reference.eval()
    assert rebuilt.state_dict().keys() == reference.state_dict().keys()
    for (name, value), (_, expected) in zip(
        [*rebuilt.named_parameters(), *rebuilt.named_buffers()],
        [*reference.named_parameters(), *reference.named_buffers()],
        strict=True,
    ):
        assert torch.equal(value, expected), name
    images = torch.randn(2, 3, size, size)
    with torch.no_grad():
        assert torch.equal(rebuilt(images), reference(images))


def test_a_weights_file_skips_the_draws_and_a_random_model_keeps_them(tmp_path):
    """`--model resnet18 --weights FILE` and `--model convnet --weights FILE` draw nothing
    before the file's weights; a model trained from random weights is initialised as ever, and
    torch's initialisers are themselves again after every build, a failed one too."""
    torch.manual_seed(0)
    for arch, size in MODELS[:2]:
        torch.save(build_model(arch, 3, image_size=size).state_dict(), tmp_path / f"{arch}.pt")
        with _RandomDraws() as draws:
            loaded = resolve_model(arch, weights=str(tmp_path / f"{arch}.pt"), image_size=size)
        assert draws.count == 0
        assert loaded.num_outputs == 3
        with _RandomDraws() as draws:
            resolve_model(arch, num_classes=3, image_size=size)
        assert draws.count > 0
    originals = torch.nn.init.kaiming_uniform_, torch.nn.init.trunc_normal_
    with pytest.raises(RuntimeError), skipped_weight_init():
        raise RuntimeError("the build failed")
    assert (torch.nn.init.kaiming_uniform_, torch.nn.init.trunc_normal_) == originals
    assert "normal_" not in vars(torch.Tensor)  # torch's own method again
    assert torch.empty(1000).normal_().std() > 0.5


def test_skipped_init_holds_only_in_its_thread_and_is_undone():
    import threading

    original = torch.nn.init.normal_
    inside, other_ready, other_done = {}, threading.Event(), threading.Event()

    def other_thread():
        other_ready.wait(10)
        inside["other"] = torch.nn.init.normal_(torch.zeros(1000))
        inside["method"] = torch.zeros(1000).uniform_()
        other_done.set()

    thread = threading.Thread(target=other_thread)
    thread.start()
    with skipped_weight_init() as skipped:
        tensor, drawn = torch.zeros(1000), torch.zeros(10)
        assert torch.nn.init.normal_(tensor) is tensor and not tensor.any()  # left as it was
        assert drawn.normal_() is drawn and not drawn.any()
        assert torch.nn.init.ones_(torch.zeros(3)).all()  # deterministic ones still run
        assert [pointer for pointer, _ in skipped] == [tensor.data_ptr(), drawn.data_ptr()]
        other_ready.set()  # another thread initialises while this one skips
        assert other_done.wait(10)
    thread.join()
    assert inside["other"].std() > 0.5 and inside["method"].any()  # it drew its numbers
    assert torch.nn.init.normal_ is original
    assert torch.nn.init.normal_(torch.zeros(1000)).std() > 0.5


def test_a_random_tensor_the_load_does_not_write_means_a_normal_build():
    """A non-persistent buffer drawn at random is not in the state dict: the model is built
    again with its random values rather than kept with uninitialised memory."""

    class Toy(torch.nn.Module):
        def __init__(self, buffer: bool):
            super().__init__()
            self.linear = torch.nn.Linear(4, 2)
            if buffer:
                noise = torch.nn.init.normal_(torch.zeros(4))
                self.register_buffer("noise", noise, persistent=False)

    builds = []

    def build(buffer: bool):
        builds.append(Toy(buffer))
        return builds[-1]

    model = built_for_loading(lambda: build(True))
    assert len(builds) == 2 and model is builds[1] and model.noise.any()
    builds.clear()
    # Without the buffer every tensor left uninitialised is loaded: one build, kept.
    assert built_for_loading(lambda: build(False)) is builds[0] and len(builds) == 1


def test_a_layer_the_build_throws_away_does_not_mean_a_second_build():
    """timm's EfficientNet builder makes a squeeze-excite layer to probe its arguments and drops
    it: the model is built once, unless it holds a tensor the load does not write, where the
    dropped layer's values could have gone."""

    class Toy(torch.nn.Module):
        def __init__(self, keep_derived: bool):
            super().__init__()
            probe = torch.nn.Linear(4, 4)  # made, then dropped
            self.linear = torch.nn.Linear(4, 2)
            if keep_derived:
                self.register_buffer("scale", probe.weight.detach() * 2, persistent=False)

    builds = []

    def build(keep_derived: bool):
        builds.append(Toy(keep_derived))
        return builds[-1]

    assert built_for_loading(lambda: build(False)) is builds[0] and len(builds) == 1
    builds.clear()
    assert built_for_loading(lambda: build(True)) is builds[1] and builds[1].scale.any()
