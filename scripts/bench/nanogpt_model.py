"""nanoGPT's own model.py as a harness model: ``--model scripts.bench.nanogpt_model:gpt2``.

The model is read from a checkout of karpathy/nanoGPT (``$NANOGPT_DIR``, default ``.nanogpt`` in the
checkout root; not part of this repository), built with nanoGPT's GPT-2 124M recipe (block 1024,
vocabulary padded to 50304, no biases, no dropout) and wrapped so that its forward returns every
position's logits: nanoGPT's own forward without targets returns the last position's only (its
inference shortcut), and the harness computes the loss itself.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[2]


def _nanogpt() -> Any:
    folder = Path(os.environ.get("NANOGPT_DIR", ROOT / ".nanogpt"))
    spec = importlib.util.spec_from_file_location("nanogpt_model_py", folder / "model.py")
    if spec is None or not (folder / "model.py").is_file():
        raise ImportError(f"no nanoGPT model.py in {folder}: set NANOGPT_DIR to a checkout of karpathy/nanoGPT")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module         # torch.compile looks the model's globals up by module name
    spec.loader.exec_module(module)
    return module


class AllLogits(torch.nn.Module):
    """nanoGPT's GPT, every position's logits."""

    def __init__(self, gpt: torch.nn.Module):
        super().__init__()
        self.gpt = gpt

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        body = self.gpt.transformer
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = body.drop(body.wte(idx) + body.wpe(pos))
        for block in body.h:
            x = block(x)
        return self.gpt.lm_head(body.ln_f(x))


def gpt2_124m(block_size: int = 1024, bias: bool = False) -> torch.nn.Module:
    """nanoGPT's own GPT at its GPT-2 124M recipe (its forward as written: (logits, loss) with targets)."""
    nanogpt = _nanogpt()
    return nanogpt.GPT(nanogpt.GPTConfig(block_size=block_size, vocab_size=50304, n_layer=12, n_head=12, n_embd=768,
                                         dropout=0.0, bias=bias))


def gpt2(info: Any, block_size: int = 1024, bias: bool = False) -> torch.nn.Module:
    return AllLogits(gpt2_124m(block_size, bias))


def token_batches(tokens: Path, seed: int, batch: int = 16, block: int = 1024) -> Callable[[], tuple]:
    """nanoGPT's get_batch on the GPU: ``batch`` random windows of ``tokens``/train.bin (uint16), inputs and
    next-token targets, copied from pinned memory without waiting."""
    import numpy as np
    data = np.memmap(tokens / "train.bin", dtype=np.uint16, mode="r")
    generator = np.random.default_rng(seed)

    def next_batch() -> tuple:
        starts = generator.integers(0, len(data) - block - 1, batch)
        window = torch.from_numpy(np.stack([data[i:i + block + 1].astype(np.int64) for i in starts]))
        return window[:, :-1].pin_memory().cuda(non_blocking=True), window[:, 1:].pin_memory().cuda(non_blocking=True)
    return next_batch
