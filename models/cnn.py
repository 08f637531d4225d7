"""LeNet-style convolutional classifier that adapts to 8x8, 28x28 and 32x32 images."""

from torch import nn

from .checks import expect_kind

POOLED = 4  # spatial size fed to the classifier, whatever the input size


def cnn(info, hidden: int = 120) -> nn.Module:
    """conv-pool-conv-pool-fc-fc; 'same' padding and adaptive pooling make any input size work."""
    expect_kind(info, "cnn", "image")
    return nn.Sequential(
        nn.Conv2d(info.input_shape[0], 6, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(POOLED),
        nn.Flatten(),
        nn.Linear(16 * POOLED * POOLED, hidden),
        nn.ReLU(),
        nn.Linear(hidden, info.num_classes),
    )
