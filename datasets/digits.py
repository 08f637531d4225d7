"""sklearn's bundled 8x8 handwritten digits: a real task that needs no download.

Importing sklearn takes longer (1.3 s on a GPU host) than the default run's whole training, and
every process of a run loads the data. So the images and their fixed split are cached after the
first load, keyed by sklearn's version, in ``$XDG_CACHE_HOME/harness`` (default ``~/.cache/harness``),
and later loads read that file without importing sklearn. A cache that cannot be written or read
is rebuilt and never an error.
"""
import os
from importlib import metadata
from pathlib import Path

import torch

from harness.resilience.checkpoint import write_atomically

from .split import DataInfo, Split

INFO = DataInfo("image", (1, 8, 8), 10, tuple(str(d) for d in range(10)))
SPLIT_SEED = 0  # fixed so every run is evaluated on the same test images


def load_digits(data_dir: str | None, seed: int) -> tuple[Split, Split]:
    """Stratified 80/20 split; `seed` and `data_dir` are ignored because the split must never vary."""
    path = cache_path()
    try:
        x, y, train_idx, test_idx = torch.load(path, weights_only=True)
    except Exception:       # absent, unreadable or torn: rebuilt below
        x, y, train_idx, test_idx = _from_sklearn()
        _write(path, (x, y, train_idx, test_idx))
    return Split(x[train_idx], y[train_idx], INFO), Split(x[test_idx], y[test_idx], INFO)


def cache_path() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "harness" / f"digits-sklearn-{metadata.version('scikit-learn')}.pt"


def _from_sklearn() -> tuple[torch.Tensor, ...]:
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    bunch = sklearn_digits()
    x = torch.tensor(bunch.data / 16.0, dtype=torch.float32).reshape(-1, *INFO.input_shape)
    y = torch.tensor(bunch.target, dtype=torch.int64)
    train_idx, test_idx = train_test_split(
        torch.arange(len(y)).numpy(), test_size=0.2, stratify=bunch.target, random_state=SPLIT_SEED
    )
    return x, y, torch.from_numpy(train_idx), torch.from_numpy(test_idx)


def _write(path: Path, tensors: tuple[torch.Tensor, ...]) -> None:
    """Atomically (several processes may build the cache at once); a cache we cannot write is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, tensors)
    except OSError:
        pass
