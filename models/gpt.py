"""Decoder-only transformer (GPT-2 layout) with tied input/output embeddings."""

import math
from collections import OrderedDict
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import nn

from .checks import expect_kind


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int | None = None  # None: the dataset's sequence length
    dropout: float = 0.0
    bias: bool = True  # biases in the Linear and LayerNorm layers (GPT-2 has them; nanoGPT's recipe drops them)


SIZES = {
    "tiny": GPTConfig(n_layer=2, n_head=4, n_embd=128),  # trains in seconds on a CPU
    "124m": GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024),  # GPT-2 small
}


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, c = x.shape
        q, k, v = self.qkv(x).view(n, t, 3, self.n_head, c // self.n_head).permute(2, 0, 3, 1, 4)
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(n, t, c))


class Block(nn.Module):
    """Pre-LayerNorm residual block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = nn.Sequential(
            OrderedDict(
                fc=nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias),
                gelu=nn.GELU(),
                proj=nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias),
                drop=nn.Dropout(cfg.dropout),
            )
        )
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.mlp(self.ln2(x))


PAD_VOCAB = 64  # the embedding table's rows, rounded up: GPT-2's 50257 -> 50304, a multiple the matmul kernels like
NEVER = -1e4  # the padded logits: exp(NEVER - any real logit) is 0 in float32, and no arithmetic meets an inf


class GPT(nn.Module):
    """The vocabulary is padded to a multiple of PAD_VOCAB inside the model (nanoGPT's trick: the
    output matmul and the loss run on aligned rows at full speed). The padded logits are held at
    NEVER by a constant bias, added in the matmul's epilogue: the softmax, and so the loss, the
    accuracy and Test.py, see the real vocabulary, and the padded rows get no gradient. (Cutting
    the logits back to the vocabulary instead made the loss run on unaligned rows: 5% slower and
    3 GB more for GPT-2 124M on an H100, bench/results/2026-11-25-h100-single.)"""

    def __init__(self, cfg: GPTConfig, vocab_size: int) -> None:
        super().__init__()
        self.block_size, self.vocab_size = cfg.block_size, vocab_size
        padded = -(-vocab_size // PAD_VOCAB) * PAD_VOCAB
        self.wte = nn.Embedding(padded, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, padded, bias=False)
        self.register_buffer("vocab_mask", torch.cat([torch.zeros(vocab_size), torch.full((padded - vocab_size,), NEVER)]))
        self.lm_head.weight = self.wte.weight  # tied: one Parameter, counted and updated once
        self._init_weights(cfg.n_layer)

    def _init_weights(self, n_layer: int) -> None:
        """GPT-2 init; residual output projections are scaled down so the residual stream stays O(1) with depth."""
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """(N, T) token ids -> (N, T, padded vocabulary) next-token logits, the padding at NEVER."""
        t = idx.shape[1]
        if t > self.block_size:
            raise ValueError(
                f"sequence length {t} exceeds block_size {self.block_size}; build the gpt with block_size >= {t}"
            )
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.lm_head.weight, self.vocab_mask)


def gpt(info, size: str = "tiny", **overrides) -> nn.Module:
    """Build a preset `size`, with any GPTConfig field (n_layer, n_head, n_embd, block_size, dropout) overridden."""
    expect_kind(info, "gpt", "tokens")
    if size not in SIZES:
        raise ValueError(f"unknown gpt size '{size}'; valid sizes: {', '.join(SIZES)}")
    valid = [f.name for f in fields(GPTConfig)]
    unknown = sorted(set(overrides) - set(valid))
    if unknown:
        raise ValueError(f"unknown gpt option(s) {unknown}; valid options: size, {', '.join(valid)}")
    cfg = replace(SIZES[size], **overrides)
    if cfg.block_size is None:
        cfg = replace(cfg, block_size=info.input_shape[0])
    if not 0 <= cfg.dropout < 1:
        raise ValueError(f"gpt dropout={cfg.dropout} must be in [0, 1)")
    if cfg.n_embd % cfg.n_head:
        raise ValueError(f"n_embd={cfg.n_embd} is not divisible by n_head={cfg.n_head}; pick sizes that divide")
    return GPT(cfg, info.num_classes)
