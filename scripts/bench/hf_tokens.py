"""A token file as Hugging Face causal-LM samples, ``{"input_ids", "labels"}`` (the model shifts the
labels itself), for the Hugging Face rows of scripts/bench/single.py: the same windows that
``--dataset tokens`` reads, for Train.py (``--dataset scripts.bench.hf_tokens:windows``) and for
transformers' Trainer alike."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from harness.checkout.datasets.tokens import TokenWindows


class HFWindows(torch.utils.data.Dataset):
    num_classes = 50257

    def __init__(self, windows: TokenWindows):
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        x, _ = self.windows[index]
        return {"input_ids": x, "labels": x}


def windows(split: str, data_dir: str | None, block_size: int = 1024) -> Any:
    limit = None if split == "train" else 16
    return HFWindows(TokenWindows(Path(data_dir) / f"{split}.bin", block_size, "uint16", 50257, limit))
