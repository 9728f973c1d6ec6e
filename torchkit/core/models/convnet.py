"""The built-in `convnet`: PyTorch's examples/mnist network, for any channel count and size."""

from __future__ import annotations

from torchkit.core.io.errors import UsageError


def convnet_class():
    import torch
    from torch import nn

    class ConvNet(nn.Module):
        """The classic two-convolution MNIST network (PyTorch's examples/mnist), made to accept any
        channel count and input size: the flattened size is computed from `image_size`."""

        def __init__(self, num_classes: int = 10, in_channels: int = 3, image_size: int = 28):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(in_channels, 32, 3),
                nn.ReLU(inplace=True),
                nn.Conv2d(32, 64, 3),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(2),
                nn.Dropout(0.25),
            )
            side = (image_size - 4) // 2
            if side < 1:
                raise UsageError(f"convnet needs images of at least 6x6, not {image_size}")
            _check_fits(image_size, 64 * side * side * 128)
            self.classifier = nn.Sequential(
                nn.Flatten(),
                nn.Linear(64 * side * side, 128),
                nn.ReLU(inplace=True),
                nn.Dropout(0.5),
                nn.Linear(128, num_classes),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.classifier(self.features(x))

    return ConvNet


def _check_fits(image_size: int, classifier_weights: int) -> None:
    """The first linear layer grows with the square of the image side (4.6 billion weights at
    1,500 px, which a checkpoint can record): past half the memory free, refused before its
    allocation, which would end in the kernel's OOM killer rather than an error (training
    needs its gradient and optimiser state too)."""
    from torchkit.core.runtime.memory import beyond_half_free

    needed = classifier_weights * 4
    free = beyond_half_free(needed)
    if free is not None:
        raise UsageError(
            f"convnet at {image_size} px has {classifier_weights:,} weights in its first linear "
            f"layer ({needed / 1e9:,.1f} GB), more than half the {free / 1e9:,.1f} GB free here",
            "convnet is made for small images: give a smaller --image-size, or a model made "
            "for large images such as resnet18",
        )
