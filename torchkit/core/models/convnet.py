"""The built-in `convnet`: PyTorch's examples/mnist network, for any channel count and size."""

from __future__ import annotations

from torchkit.core.io.errors import UsageError
from torchkit.core.io.sizes import gigabytes_text


def convnet_class():
    import torch
    from torch import nn

    class ConvNet(nn.Module):
        """The classic two-convolution MNIST network (PyTorch's examples/mnist), made to accept any
        channel count and input size: the flattened size is computed from `image_size`."""

        def __init__(
            self,
            num_classes: int = 10,
            in_channels: int = 3,
            image_size: int | tuple[int, int] = 28,
        ):
            super().__init__()
            # N (square images) or (H, W): summary's input of another shape, -i 3,32,48
            height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
            size = f"{height}x{width}" if height != width else str(height)
            self.features = nn.Sequential(
                nn.Conv2d(in_channels, 32, 3),
                nn.ReLU(inplace=True),
                nn.Conv2d(32, 64, 3),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
                nn.Dropout(0.25),
            )
            rows, columns = (height - 4) // 2, (width - 4) // 2
            if rows < 1 or columns < 1:
                raise UsageError(f"convnet needs images of at least 6x6, not {size}")
            _check_fits(size, 64 * rows * columns * 128)
            self.classifier = nn.Sequential(
                nn.Flatten(),
                nn.Linear(64 * rows * columns, 128),
                nn.ReLU(inplace=True),
                nn.Dropout(0.5),
                nn.Linear(128, num_classes),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            features = self.features(x)
            # Not compiled by torch.jit.script (the hook is Python's), which skips this branch.
            if not torch.jit.is_scripting() and self.training:
                _gradient_as_channels_last(features)
            return self.classifier(features)

    return ConvNet


def _gradient_as_channels_last(features) -> None:
    """Flatten's backward hands channels-last feature maps an NCHW gradient, and on the CPU
    max-pool's backward then works in NCHW: it copies its zeroed gradient and its indices to
    NCHW and the result back, 0.15 ms of the digits job's 4-5 ms step. The gradient made
    channels-last first costs one copy of the small pooled maps; the values are the same."""
    import torch

    channels_last = torch.channels_last
    if not isinstance(features, torch.Tensor):  # a torch.fx trace's Proxy: no control flow
        return
    if torch.jit.is_tracing() or torch.compiler.is_compiling():
        return
    if not features.requires_grad or features.device.type != "cpu":
        return
    if features.ndim == 4 and features.is_contiguous(memory_format=channels_last):
        features.register_hook(lambda grad: grad.contiguous(memory_format=channels_last))


def _check_fits(image_size: str, classifier_weights: int) -> None:
    """The first linear layer grows with the square of the image side (4.6 billion weights at
    1,500 px, which a checkpoint can record): past half the memory free, refused before its
    allocation, which would end in the kernel's OOM killer rather than an error (training
    needs its gradient and optimiser state too)."""
    from torchkit.core.runtime.memory import beyond_half_free, limit_words

    needed = classifier_weights * 4
    free = beyond_half_free(needed)
    if free is not None:
        raise UsageError(
            f"convnet at {image_size} px has {classifier_weights:,} weights in its first linear "
            f"layer ({gigabytes_text(needed)}), more than half the {gigabytes_text(free)} free here"
            f"{limit_words(free)}",
            "convnet is made for small images: give a smaller --image-size, or a model made "
            "for large images such as resnet18",
        )
