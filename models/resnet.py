"""ResNets written out by hand (no torchvision): CIFAR-style ResNet-18 and ImageNet ResNet-50."""

from collections.abc import Callable

import torch
from torch import nn

from .checks import expect_kind

WIDTHS = (64, 128, 256, 512)
BOTTLENECK_EXPANSION = 4


def _conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(c_out)]


class Residual(nn.Module):
    """relu(body(x) + shortcut(x)): the one forward shared by both block types."""

    def __init__(self, body: nn.Module, shortcut: nn.Module) -> None:
        super().__init__()
        self.body = body
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def basic_block(c_in: int, width: int, stride: int) -> Residual:
    """Two 3x3 convs; outputs `width` channels."""
    body = nn.Sequential(*_conv_bn(c_in, width, 3, stride), nn.ReLU(inplace=True), *_conv_bn(width, width, 3))
    return Residual(body, _shortcut(c_in, width, stride))


def bottleneck(c_in: int, width: int, stride: int) -> Residual:
    """1x1 reduce, 3x3 (strided, as in ResNet v1.5), 1x1 expand; outputs 4 * `width` channels."""
    c_out = width * BOTTLENECK_EXPANSION
    body = nn.Sequential(
        *_conv_bn(c_in, width, 1),
        nn.ReLU(inplace=True),
        *_conv_bn(width, width, 3, stride),
        nn.ReLU(inplace=True),
        *_conv_bn(width, c_out, 1),
    )
    return Residual(body, _shortcut(c_in, c_out, stride))


def _shortcut(c_in: int, c_out: int, stride: int) -> nn.Module:
    if stride == 1 and c_in == c_out:
        return nn.Identity()
    return nn.Sequential(*_conv_bn(c_in, c_out, 1, stride))


def _resnet(
    stem: list[nn.Module],
    block: Callable[[int, int, int], Residual],
    expansion: int,
    depths: tuple[int, ...],
    classes: int,
) -> nn.Module:
    layers, c_in = list(stem), WIDTHS[0]
    for stage, (width, depth) in enumerate(zip(WIDTHS, depths)):
        for i in range(depth):
            stride = 2 if stage > 0 and i == 0 else 1
            layers.append(block(c_in, width, stride))
            c_in = width * expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, classes)]
    return nn.Sequential(*layers)


def resnet18(info) -> nn.Module:
    """CIFAR variant: 3x3 stride-1 stem and no max-pool, so 32x32 inputs keep their resolution."""
    expect_kind(info, "resnet18", "image")
    stem = [*_conv_bn(info.input_shape[0], WIDTHS[0], 3), nn.ReLU(inplace=True)]
    return _resnet(stem, basic_block, 1, (2, 2, 2, 2), info.num_classes)


def resnet50(info) -> nn.Module:
    """ImageNet variant (25.6M parameters at 1000 classes): 7x7 stride-2 stem and max-pool."""
    expect_kind(info, "resnet50", "image")
    stem = [*_conv_bn(info.input_shape[0], WIDTHS[0], 7, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    return _resnet(stem, bottleneck, BOTTLENECK_EXPANSION, (3, 4, 6, 3), info.num_classes)
