"""The old Lua harness's toy task: tell whether an integer is odd or even from its bits."""

import torch

from .split import DataInfo, Split

BITS = 10
INFO = DataInfo("vector", (BITS,), 2, ("even", "odd"))
SPLIT_SEED = 0
TEST_FRACTION = 0.2


def encode_oddeven(n: torch.Tensor) -> torch.Tensor:
    """Integers -> float bits, least significant first (bit 0 alone decides the class)."""
    return ((n.unsqueeze(-1) >> torch.arange(BITS)) & 1).float()


def decode_oddeven(x: torch.Tensor) -> torch.Tensor:
    """Bits -> the integers they encode, so reports can print the input as a number."""
    return (x.round().long() << torch.arange(BITS)).sum(-1)


def load_oddeven(data_dir: str | None, seed: int) -> tuple[Split, Split]:
    """All 2**BITS integers, split by a fixed permutation so the test set never changes with `seed`."""
    n = torch.randperm(2**BITS, generator=torch.Generator().manual_seed(SPLIT_SEED))
    num_test = int(len(n) * TEST_FRACTION)
    test, train = n[:num_test], n[num_test:]
    return (
        Split(encode_oddeven(train), train % 2, INFO),
        Split(encode_oddeven(test), test % 2, INFO),
    )
