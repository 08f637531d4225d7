"""Dataset registry: every loader returns an in-memory (train, test) pair of Splits."""

from collections.abc import Callable

from datasets.cifar10 import load_cifar10
from datasets.digits import load_digits
from datasets.mnist import load_mnist
from datasets.oddeven import decode_oddeven, load_oddeven
from datasets.split import DataInfo, Split
from datasets.synthetic import load_synthetic

__all__ = ["DATASETS", "DataInfo", "Split", "dataset_names", "decode_oddeven", "load_dataset"]

DATASETS: dict[str, Callable[..., tuple[Split, Split]]] = {
    "cifar10": load_cifar10,
    "digits": load_digits,
    "mnist": load_mnist,
    "oddeven": load_oddeven,
    "synthetic": load_synthetic,
}


def dataset_names() -> list[str]:
    return sorted(DATASETS)


def load_dataset(name: str, data_dir: str | None = None, seed: int = 0, **options) -> tuple[Split, Split]:
    """Load `name`; options go to its loader (e.g. synthetic's shape, size, tokens)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset '{name}'; valid names: {', '.join(dataset_names())}")
    return DATASETS[name](data_dir, seed, **options)
