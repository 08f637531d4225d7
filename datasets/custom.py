"""Your own dataset: ``--dataset package.module:factory``, the same convention as models.

``factory(split, data_dir, **options)`` is called with split ``"train"`` and ``"val"`` and returns
a map-style ``torch.utils.data.Dataset`` whose samples are ``(x, y)`` pairs (tensors or numpy
arrays; ``y`` may be an int), dicts of tensors (passed to the model as keyword arguments, as Hugging
Face's ``input_ids``/``attention_mask``/``labels``) or tuples of tensors, or ``None`` for a split it
does not have (no validation then, and Test.py has nothing to score). A dataset with a
``collate_fn`` attribute (padding variable-length samples, say) has its batches made by it. Any
existing Dataset class plugs in through a three-line factory; a Hugging Face ``datasets.Dataset``
with ``set_format("torch")`` plugs in as it is.

What the model needs to know (``DataInfo``) is taken from ``dataset.info`` if it has one, else
read off the first sample and ``dataset.classes`` (torchvision's name) or ``dataset.num_classes``; a
dataset of float targets (a regression) needs neither, and its ``num_classes`` is 1 (one output).
The factory is called with the global random generators seeded from ``--seed`` (``seeded``).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from harness.plugins import check_call, import_factory

from .split import DataError, DataInfo


def open_custom(spec: str, data_dir: str | None, seed: int = 0, /, **options: Any) -> tuple[Any, Any]:
    """(train, val) from the factory named by ``spec``; val may be None."""
    factory = import_factory(spec, "dataset", "factory(split, data_dir, **options)")
    check_call(factory, f"--dataset {spec}", "factory(split, data_dir, **options)", "train", data_dir, **options)
    train = seeded(factory, "train", data_dir, seed, options)
    val = seeded(factory, "val", data_dir, seed, options)
    for split, dataset in (("train", train), ("val", val)):
        if dataset is not None and not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise DataError(f"dataset factory {spec} returned a {type(dataset).__name__} for split {split!r}; "
                            "return a map-style torch.utils.data.Dataset (with __getitem__ and __len__) or None")
    if train is None or len(train) == 0:
        raise DataError(f"dataset factory {spec} returned no training samples; it must return a non-empty "
                        "Dataset for split 'train'")
    info = infer_info(train, spec, val)
    return Described(train, info), (Described(val, info) if val is not None else None)


SPLIT_SEEDS = {"train": 0, "val": 1}        # added to the run's seed: a split's random draws are not another's


def seeded(factory: Any, split: str, data_dir: str | None, seed: int, options: dict[str, Any]) -> Any:
    """``factory(split, data_dir, **options)`` with Python's, numpy's and torch's global generators seeded from the
    run's seed and the split, and put back as they were after: a factory that draws its samples at random (the
    README's example does) makes the same data in every worker and each time it is opened (rank 0 opens it for
    its checks first), rather than a different dataset on each rank."""
    import random
    python_state, numpy_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        random.seed(seed + SPLIT_SEEDS[split])
        np.random.seed(seed + SPLIT_SEEDS[split])
        torch.default_generator.manual_seed(seed + SPLIT_SEEDS[split])
        try:
            return factory(split, data_dir, **options)
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)


class Described(torch.utils.data.Dataset):
    """The user's Dataset with the DataInfo the harness reads; its own ``.info`` (Hugging Face's
    datasets have one of another kind) is left alone."""

    def __init__(self, dataset: Any, info: DataInfo):
        self.dataset, self.info = dataset, info
        self.collate = getattr(dataset, "collate_fn", None)       # the pipeline's DataLoader uses it
        self.static_shapes = self.collate is None       # a collate_fn of one's own may pad to each batch's longest

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]


def infer_info(dataset: Any, spec: str, val: Any = None) -> DataInfo:
    """What the model is built for, from ``dataset`` (the training split; ``val``: the validation split, whose
    labels count too where they are read off a TensorDataset)."""
    if isinstance(getattr(dataset, "info", None), DataInfo):
        return dataset.info
    from harness.data.bad_samples import fetch      # harness.data imports this package
    sample, _ = fetch(dataset, 0)                   # the first sample that loads
    if isinstance(sample, dict) or (isinstance(sample, (tuple, list)) and len(sample) != 2):
        # keyword or positional inputs: the model's own factory knows their sizes (a vocabulary, say)
        count = getattr(dataset, "num_classes", None)
        return DataInfo("dict" if isinstance(sample, dict) else "tuple", (), count if isinstance(count, int) else 0)
    x, y = sample
    x = torch.as_tensor(np.asarray(x)) if not torch.is_tensor(x) else x
    classes = getattr(dataset, "classes", None)
    count = len(classes) if classes is not None else getattr(dataset, "num_classes", None)
    count = labels_in(dataset, val) if count is None else count
    if _is_regression(y) and not isinstance(count, int):
        count = 1       # float targets: a regression, whose model has one output per target unless it says more
    if not isinstance(count, int) or count < 1 or (count == 1 and not _is_regression(y)):
        raise DataError(f"dataset {spec}: cannot tell the number of classes; give the dataset a `classes` list, "
                        "a `num_classes` int (2 or more), or an `info` (harness.checkout.datasets.DataInfo); "
                        "float targets need none (a regression)")
    if count > 1 and _is_regression(y) and np.ndim(y) == 0:
        raise DataError(f"dataset {spec}: its targets are floats ({y!r}) but it names {count} classes; class labels "
                        "are integers (y.long(), int(y)), or drop `classes`/`num_classes` for a regression")
    names = tuple(str(c) for c in classes) if classes is not None else ()
    return DataInfo(kind_of(x), tuple(x.shape), count, names)


def labels_in(*splits: Any) -> int | None:
    """The classes the integer labels of TensorDataset ``splits`` count (their largest plus one), read off their
    label tensors at no cost; None where none is such a dataset (any other would have to be read whole)."""
    counts = [int(split.tensors[1].max()) + 1 for split in splits
              if isinstance(split, torch.utils.data.TensorDataset) and len(split.tensors) == 2 and len(split)
              and not split.tensors[1].is_floating_point()]
    return max(counts, default=None)


def kind_of(x: torch.Tensor) -> str:
    """What a sample is, for the built-in models' checks: an image (C, H, W), a vector (D,), token ids (T,), a
    sequence of vectors (T, D), else a tensor (the user's own model knows it)."""
    if x.is_floating_point() or x.dtype == torch.uint8:
        return {1: "vector", 2: "sequence", 3: "image"}.get(x.dim(), "tensor")
    return "tokens" if x.dim() == 1 else "tensor"


def _is_regression(target: Any) -> bool:
    """Float targets, which no classification has."""
    return isinstance(target, float) or (torch.is_tensor(target) and target.is_floating_point()) or \
        (isinstance(target, np.ndarray) and np.issubdtype(target.dtype, np.floating))
