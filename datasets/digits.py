"""sklearn's bundled 8x8 handwritten digits: a real task that needs no download."""

import torch

from .split import DataInfo, Split

INFO = DataInfo("image", (1, 8, 8), 10, tuple(str(d) for d in range(10)))
SPLIT_SEED = 0  # fixed so every run is evaluated on the same test images


def load_digits(data_dir: str | None, seed: int) -> tuple[Split, Split]:
    """Stratified 80/20 split; `seed` and `data_dir` are ignored because the split must never vary."""
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    bunch = sklearn_digits()
    x = torch.tensor(bunch.data / 16.0, dtype=torch.float32).reshape(-1, *INFO.input_shape)
    y = torch.tensor(bunch.target, dtype=torch.int64)
    train_idx, test_idx = train_test_split(
        torch.arange(len(y)).numpy(), test_size=0.2, stratify=bunch.target, random_state=SPLIT_SEED
    )
    return (
        Split(x[train_idx], y[train_idx], INFO),
        Split(x[test_idx], y[test_idx], INFO),
    )
