"""Scaled-dot-product attention's kernels at GPT-2 124M's shapes: which torch runs, and how fast each is.

torch picks one of its SDPA kernels (FlashAttention-2, cuDNN's, memory-efficient, math) by a priority
order (SDPBackend's numbers: 0 math, 1 flash, 2 efficient, 3 cuDNN), which CUDA's start may change for the
GPU it finds. This records the order before and after CUDA's start and times, on one GPU, forward +
backward of causal attention (batch 16, 12 heads, 1024 tokens, head size 64, bf16) under each kernel
alone, with its largest difference from FlashAttention-2's output and gradients.

    python -m scripts.bench.attention --out bench/results/DATE-DEVICE-attention
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from scripts.bench.common import bench_record, write_json

BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")


def kernel_rows(repeats: int = 50) -> list[dict]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(0)
    q, k, v = (torch.randn(16, 12, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    grad = torch.randn_like(q)
    results, reference = [], None
    for name in BACKENDS:
        def run() -> list:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return [out, *torch.autograd.grad(out, (q, k, v), grad)]
        try:
            with sdpa_kernel(getattr(SDPBackend, name)):
                for _ in range(5):
                    values = run()
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(repeats):
                    run()
                torch.cuda.synchronize()
        except RuntimeError as error:
            results.append({"backend": name, "error": str(error).splitlines()[0][:300]})
            continue
        reference = reference or values
        diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(values, reference))
        results.append({"backend": name, "fwd_bwd_ms": (time.perf_counter() - start) / repeats * 1000,
                        "max_abs_diff_vs_flash": diff})
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("bench-attention"))
    p.add_argument("--repeats", type=int, default=50, help="timed forward + backward passes of each kernel")
    args = p.parse_args()
    import torch
    before = [int(b) for b in torch._C._get_sdp_priority_order()]
    torch.cuda.init()
    record = {"priority_before_cuda": before, "priority": [int(b) for b in torch._C._get_sdp_priority_order()],
              "kernels": kernel_rows(args.repeats)}
    write_json(args.out / "bench_attention.json", bench_record(**record))
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    sys.exit(main())
