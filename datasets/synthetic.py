"""Generated data for benchmarks and convergence tests: learnable, deterministic, cheap."""

from functools import partial

import torch
import torch.nn.functional as F

from .split import DataInfo, Split

DATA_SEED = 1234  # fixed, not the run's seed, so every run and every rank sees the same data
TEACHER_GRID = 4  # images are pooled to this grid before the teacher looks at them
PIXEL_NOISE = 0.5


def describe_synthetic(
    shape: tuple[int, ...] = (3, 32, 32),
    num_classes: int = 10,
    size: int = 4096,
    tokens: bool = False,
    seq_len: int = 64,
    vocab_size: int = 256,
) -> tuple[DataInfo, int]:
    """(info, training samples) of the data load_synthetic would make, without making it."""
    if size < 4:
        raise ValueError(f"synthetic size={size} is too small; use size >= 4 so the test split is not empty")
    if tokens:
        return DataInfo("tokens", (seq_len,), vocab_size), size
    if len(shape) not in (1, 3):
        raise ValueError(f"synthetic shape={tuple(shape)} is not supported; use (D,) for vectors or (C, H, W) for images")
    return DataInfo("vector" if len(shape) == 1 else "image", tuple(shape), num_classes), size


def load_synthetic(data_dir: str | None, seed: int, **options) -> tuple[Split, Split]:
    """Train has `size` samples and test `size // 4`; `seed` and `data_dir` are ignored."""
    info, size = describe_synthetic(**options)
    generator = torch.Generator().manual_seed(DATA_SEED)
    if info.kind == "tokens":
        table = torch.randperm(info.num_classes, generator=generator)
        make = partial(_token_split, seq_len=info.input_shape[0], table=table, generator=generator)
    else:
        teacher = torch.randn(_teacher_features(info.input_shape), info.num_classes, generator=generator)
        make = partial(_teacher_split, shape=info.input_shape, teacher=teacher, generator=generator)
    return make(size), make(size // 4)


def _teacher_features(shape: tuple[int, ...]) -> int:
    return shape[0] if len(shape) == 1 else shape[0] * TEACHER_GRID**2


def _teacher_split(n: int, shape: tuple[int, ...], teacher: torch.Tensor, generator: torch.Generator) -> Split:
    """Inputs labelled by a fixed random linear teacher; images are smooth and the teacher sees them pooled.

    Images are coarse Gaussian patterns (upsampled from the teacher's grid) plus
    pixel noise, so the label signal is strong and spatially smooth: convolutional
    and dense models both pick it up in a few epochs.
    """
    if len(shape) == 1:
        kind = "vector"
        x = features = torch.randn(n, *shape, generator=generator)
    else:
        kind = "image"
        coarse = torch.randn(n, shape[0], TEACHER_GRID, TEACHER_GRID, generator=generator)
        x = F.interpolate(coarse, size=shape[1:]) + PIXEL_NOISE * torch.randn(n, *shape, generator=generator)
        features = F.adaptive_avg_pool2d(x, TEACHER_GRID).flatten(1)
    y = (features @ teacher).argmax(1)
    return Split(x, y, DataInfo(kind, shape, teacher.shape[1]))


def _token_split(n: int, seq_len: int, table: torch.Tensor, generator: torch.Generator) -> Split:
    """Each token is a fixed permutation of the previous one, so every next token is predictable."""
    tokens = [torch.randint(len(table), (n,), generator=generator)]
    for _ in range(seq_len):  # loops over positions only; each step is vectorised over samples
        tokens.append(table[tokens[-1]])
    seq = torch.stack(tokens, 1)
    return Split(seq[:, :-1], seq[:, 1:], DataInfo("tokens", (seq_len,), len(table)))
