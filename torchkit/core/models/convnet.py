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
