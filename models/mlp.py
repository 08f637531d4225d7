"""Fully connected classifiers for any input shape."""

import math

from torch import nn


def mlp(info, hidden: tuple[int, ...] = (512, 512)) -> nn.Module:
    """Flatten, then Linear+ReLU per hidden size: 784-512-512-10 on MNIST."""
    sizes = [math.prod(info.input_shape), *hidden]
    layers: list[nn.Module] = [nn.Flatten()]
    for size_in, size_out in zip(sizes, sizes[1:]):
        layers += [nn.Linear(size_in, size_out), nn.ReLU()]
    layers.append(nn.Linear(sizes[-1], info.num_classes))
    return nn.Sequential(*layers)


def oddeven(info, hidden: tuple[int, ...] = (16,)) -> nn.Module:
    """The old harness's toy net: one small hidden layer is plenty to read the parity bit."""
    return mlp(info, hidden)
