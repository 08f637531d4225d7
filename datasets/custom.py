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
read off the first sample and ``dataset.classes`` (torchvision's name) or ``dataset.num_classes``.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from harness.plugins import import_factory

from .split import DataError, DataInfo


def open_custom(spec: str, data_dir: str | None, **options: Any) -> tuple[Any, Any]:
    """(train, val) from the factory named by ``spec``; val may be None."""
    factory = import_factory(spec, "dataset", "factory(split, data_dir, **options)")
    train = factory("train", data_dir, **options)
    val = factory("val", data_dir, **options)
    for split, dataset in (("train", train), ("val", val)):
        if dataset is not None and not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise DataError(f"dataset factory {spec} returned a {type(dataset).__name__} for split {split!r}; "
                            "return a map-style torch.utils.data.Dataset (with __getitem__ and __len__) or None")
    if train is None or len(train) == 0:
        raise DataError(f"dataset factory {spec} returned no training samples; it must return a non-empty "
                        "Dataset for split 'train'")
    info = infer_info(train, spec)
    return Described(train, info), (Described(val, info) if val is not None else None)


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


def infer_info(dataset: Any, spec: str) -> DataInfo:
    if isinstance(getattr(dataset, "info", None), DataInfo):
        return dataset.info
    from harness.data.bad_samples import fetch      # harness.data imports this package
    sample, _ = fetch(dataset, 0)                   # the first sample that loads
    if isinstance(sample, dict) or (isinstance(sample, (tuple, list)) and len(sample) != 2):
        # keyword or positional inputs: the model's own factory knows their sizes (a vocabulary, say)
        count = getattr(dataset, "num_classes", None)
        return DataInfo("dict" if isinstance(sample, dict) else "tuple", (), count if isinstance(count, int) else 0)
    x, _ = sample
    x = torch.as_tensor(np.asarray(x)) if not torch.is_tensor(x) else x
    classes = getattr(dataset, "classes", None)
    count = len(classes) if classes is not None else getattr(dataset, "num_classes", None)
    if not isinstance(count, int) or count < 2:
        raise DataError(f"dataset {spec}: cannot tell the number of classes; give the dataset a `classes` list, "
                        "a `num_classes` int, or an `info` (harness.checkout.datasets.DataInfo)")
    if x.is_floating_point() or x.dtype == torch.uint8:
        kind = {1: "vector", 3: "image"}.get(x.dim())
    else:
        kind = "tokens" if x.dim() == 1 else None
    if kind is None:
        raise DataError(f"dataset {spec}: samples of shape {tuple(x.shape)} and dtype {x.dtype} are not images "
                        "(C, H, W), vectors (D,) or token ids (T,); give the dataset an `info`")
    names = tuple(str(c) for c in classes) if classes is not None else ()
    return DataInfo(kind, tuple(x.shape), count, names)

