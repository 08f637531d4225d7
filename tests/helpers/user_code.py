"""Code a user writes and names on Train.py's command line: dataset factories whose samples are dicts
(a Hugging Face ``datasets.Dataset`` among them), a model that returns its own loss, a regression
target and a loss of one's own, a dataset that notes which process loads each sample, and models for the
parent's model-and-data check (too few classes; its own loss over too few classes; one that notes where it
is built). Train.py's workers import this module from the checkout."""
from __future__ import annotations

import os

import numpy as np
import torch

VOCAB, LENGTH = 32, 16


def _sequences(split: str, count: int) -> torch.Tensor:
    """Token rows where each token is the previous one plus 3 (mod VOCAB): learnable in a few updates."""
    start = torch.randint(VOCAB, (count, 1), generator=torch.Generator().manual_seed(0 if split == "train" else 1))
    return (start + 3 * torch.arange(LENGTH)) % VOCAB


def hf_tokens(split: str, data_dir: str | None, count: int = 256):
    """A Hugging Face datasets.Dataset of input_ids, attention_mask and labels, as torch tensors."""
    import datasets
    ids = _sequences(split, count if split == "train" else 64)
    table = datasets.Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist(),
                                        "labels": ids.tolist()})
    table.set_format("torch")
    table.num_classes = VOCAB
    return table


class _Rows(torch.utils.data.Dataset):
    """128 training or 32 validation token rows of LENGTH, for the datasets below to cut samples from."""

    num_classes = VOCAB

    def __init__(self, split: str):
        self.rows = _sequences(split, 128 if split == "train" else 32)

    def __len__(self) -> int:
        return len(self.rows)


class Windows(_Rows):
    """{"input_ids", "labels"} samples of one length, without a collate_fn: batches a CUDA graph can replay."""

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def windows(split: str, data_dir: str | None) -> Windows:
    return Windows(split)


class DictTokens(_Rows):
    """{"tokens", "targets"} samples of variable length, padded by its collate_fn."""

    def __getitem__(self, i: int) -> dict:
        cut = LENGTH - i % 4             # lengths 13..16
        return {"tokens": self.rows[i, :cut - 1], "targets": self.rows[i, 1:cut]}

    @staticmethod
    def collate_fn(samples: list[dict]) -> dict:
        pad = torch.nn.utils.rnn.pad_sequence
        return {"tokens": pad([s["tokens"] for s in samples], batch_first=True),
                "targets": pad([s["targets"] for s in samples], batch_first=True, padding_value=-100)}


def dict_tokens(split: str, data_dir: str | None) -> DictTokens:
    return DictTokens(split)


class OwnLoss(torch.nn.Module):
    """A tiny language model called as model(tokens=..., targets=...) that returns (logits, loss)."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, VOCAB)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.head(torch.tanh(self.embed(tokens)))
        return logits, torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


def own_loss_model(info) -> OwnLoss:
    return OwnLoss()


class DictOutput(OwnLoss):
    """OwnLoss returning a plain dict, {"logits", "loss"}."""

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        logits, loss = super().forward(tokens, targets)
        return {"logits": logits, "loss": loss}


def dict_output_model(info) -> DictOutput:
    return DictOutput()


class Regression(torch.utils.data.Dataset):
    """(x, y) with y = x . w + 1: a regression target, float (no classes: the harness reads that off y)."""

    def __init__(self, split: str):
        g = torch.Generator().manual_seed(0 if split == "train" else 1)
        self.x = torch.randn(256 if split == "train" else 64, 8, generator=g)
        self.y = self.x @ torch.linspace(-1, 1, 8) + 1

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def regression(split: str, data_dir: str | None) -> Regression:
    return Regression(split)


class Loads(Regression):
    """Regression's samples, each load noted in DATA_DIR/SPLIT.pids as the pid of the process that loaded it."""

    def __init__(self, split: str, data_dir: str):
        super().__init__(split)
        self.notes = os.path.join(data_dir, f"{split}.pids")

    def __getitem__(self, i: int):
        with open(self.notes, "a") as notes:
            notes.write(f"{os.getpid()}\n")
        return super().__getitem__(i)


def loads(split: str, data_dir: str) -> Loads:
    return Loads(split, data_dir)


def linear(info) -> torch.nn.Module:
    return torch.nn.Linear(8, 1)


def mse(output: torch.Tensor, batch) -> torch.Tensor:
    return torch.nn.functional.mse_loss(output.squeeze(-1), batch[1])


class ColumnLabels(Regression):
    """Regression's x labelled by the sign of its first value, each label a row of one integer (shape (1,)), as
    a dataframe's label column often comes."""

    classes = ["negative", "positive"]

    def __getitem__(self, i: int):
        return self.x[i], (self.x[i, :1] > 0).long()


def column_labels(split: str, data_dir: str | None) -> ColumnLabels:
    return ColumnLabels(split)


def two_classes(info) -> torch.nn.Module:
    return torch.nn.Linear(8, 2)


def five_classes(info) -> torch.nn.Module:
    """Five logits whatever the data's classes."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 5))


class FiveWithOwnLoss(torch.nn.Linear):
    """Five logits and a loss of its own that reads no target: (logits, loss)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = super().forward(x.flatten(1))
        return out, out.square().mean()


def five_with_own_loss(info) -> FiveWithOwnLoss:
    return FiveWithOwnLoss(64, 5)


BUILT: list[str] = []       # the device each ``noted`` model was built on, in order


def noted(info) -> torch.nn.Module:
    BUILT.append(torch.empty(0).device.type)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, info.num_classes))


def widened(info, width: int = 16) -> torch.nn.Module:
    """A factory with an option of its own."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, width), torch.nn.Linear(width, info.num_classes))


def reads_a_value(info) -> torch.nn.Module:
    """Scales its weights by a number it reads as it is built (``.item()``), as a factory that loads weights
    does: the meta device cannot build it."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, info.num_classes))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(torch.tensor([0.5, 1.5]).mean().item())
    return model


def mse_of_the_output_alone(output: torch.Tensor) -> torch.Tensor:
    """A loss written for another harness's signature."""
    return output.square().mean()


def mse_as_a_float(output: torch.Tensor, batch) -> float:
    return float(mse(output, batch))


def mse_per_sample(output: torch.Tensor, batch) -> torch.Tensor:
    return torch.nn.functional.mse_loss(output.squeeze(-1), batch[1], reduction="none")


class Drawn(torch.utils.data.Dataset):
    """Samples drawn at random as it is made, from torch's and numpy's global generators (as README's example
    draws them); each draw's sum is noted in DATA_DIR/draws as "split pid sum"."""

    classes = ["negative", "positive"]

    def __init__(self, split: str, data_dir: str):
        self.x = torch.randn(128 if split == "train" else 32, 64) + torch.from_numpy(np.random.rand(1, 64)).float()
        self.y = (self.x.sum(1) > 32).long()
        with open(os.path.join(data_dir, "draws"), "a") as notes:
            notes.write(f"{split} {os.getpid()} {self.x.sum().item():.6f}\n")

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def drawn(split: str, data_dir: str) -> Drawn:
    return Drawn(split, data_dir)


class Doubles(torch.utils.data.Dataset):
    """numpy float64 vectors and Python int labels, as numpy makes them by default."""

    classes = ["negative", "positive"]

    def __init__(self, split: str):
        self.x = np.random.RandomState(0 if split == "train" else 1).randn(64, 8)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], int(self.x[i].sum() > 0)


def doubles(split: str, data_dir: str | None) -> Doubles:
    return Doubles(split)


def frozen(info) -> torch.nn.Module:
    """Every parameter frozen: nothing to train."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, info.num_classes)).requires_grad_(False)


def detached_loss(output: torch.Tensor, batch) -> torch.Tensor:
    """A loss that autograd cannot take back to the model."""
    return torch.nn.functional.cross_entropy(output.detach(), batch[1])


def no_parameters(info) -> torch.nn.Module:
    return torch.nn.Flatten()


def takes_nothing() -> None:
    """A factory that forgot its arguments (a model's info; a dataset's split and data_dir)."""


def not_a_module(info) -> str:
    return "a model"


class FloatLabels(torch.utils.data.Dataset):
    """Two named classes whose labels are float 0/1, as a dataframe's column often is."""

    classes = ["no", "yes"]

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return torch.zeros(3), torch.tensor(float(i % 2 == 0))


class OneHot(FloatLabels):
    """FloatLabels' classes, each label a one-hot row of floats."""

    def __getitem__(self, i: int):
        return torch.zeros(3), torch.nn.functional.one_hot(torch.tensor(i % 2), 2).float()


def one_hot(split: str, data_dir: str | None) -> OneHot:
    return OneHot()


class IntOneHot(FloatLabels):
    """FloatLabels' classes, each label a one-hot row of integers (F.one_hot's int64)."""

    def __getitem__(self, i: int):
        return torch.zeros(3), torch.nn.functional.one_hot(torch.tensor(i % 2), 2)


def int_one_hot(split: str, data_dir: str | None) -> IntOneHot:
    return IntOneHot()


class Int32Labels(FloatLabels):
    """FloatLabels' classes as int32 labels (numpy's int32 column, taken with torch.from_numpy)."""

    def __getitem__(self, i: int):
        return torch.zeros(3), torch.tensor(i % 2, dtype=torch.int32)


def int32_labels(split: str, data_dir: str | None) -> Int32Labels:
    return Int32Labels()


class Unformatted(torch.utils.data.Dataset):
    """Rows of Python lists, as a Hugging Face datasets.Dataset gives them before set_format("torch")."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return {"input_ids": [1, 2, 3, i], "labels": [1, 2, 3, i]}


def unformatted(split: str, data_dir: str | None) -> Unformatted:
    return Unformatted()


class VaryingLengths(FloatLabels):
    """Samples of 3 to 4 values, which the default collate cannot stack."""

    def __getitem__(self, i: int):
        return torch.zeros(3 + i % 2), i % 2


def varying_lengths(split: str, data_dir: str | None) -> VaryingLengths:
    return VaryingLengths()
