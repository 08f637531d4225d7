"""One GPU, no communication: this harness's step against plain PyTorch loops written the way their
users write them today, side by side in one run.

Rows (``bench_single.json``, a list ``rows``; each with ``model``, ``variant``, ``step_ms``,
``samples_per_s``, ``peak_mb`` = torch.cuda.max_memory_reserved, ``first_step_s`` from the process's
start, ``vs_best_plain`` and ``device``):

- ``resnet50``: batch 128, bf16, fused SGD with momentum, channels_last. ``plain-eager``,
  ``plain-compile`` (torch.compile) and ``plain-compile-graph`` (torch.compile(mode="reduce-overhead"),
  compile and CUDA graphs) on one synthetic batch resident on the GPU; ``harness`` and
  ``harness-compile`` are Train.py on synthetic images (``--dataset synthetic``).
- ``gpt-nanogpt``: GPT-2 124M, nanoGPT's recipe (batch 16 x accumulation 4 x 1024 tokens, bf16, fused
  AdamW, clip 1.0, cosine schedule with warm-up). ``nanogpt`` is nanoGPT's own train.py (compile on)
  from a checkout of karpathy/nanoGPT (``--nanogpt DIR``); ``plain-compile`` and ``plain-compile-graph``
  are its loop reduced to the essentials in this script (``plain_gpt``), to profile and to try CUDA
  graphs on; ``harness`` and ``harness-compile`` are Train.py on the same token file with nanoGPT's
  model.py (scripts/bench/nanogpt_model.py).
- ``gpt-builtin``: the same recipe with this harness's ``--model gpt`` 124m (no biases, as nanoGPT's
  recipe); ``vs_best_plain`` compares it with nanoGPT's train.py, ``vs_nanogpt_model`` with nanoGPT's
  model in the same harness variant.
- ``gpt-hf``: Hugging Face's GPT2LMHeadModel(GPT2Config()) on the same recipe and token windows
  (scripts/bench/hf_tokens.py): ``hf-trainer`` and ``hf-trainer-compile`` (torch_compile=True) are
  transformers' own Trainer; ``harness`` and ``harness-compile`` are Train.py with ``--model hf-causal-lm``.

Each row runs in a process of its own (its own peak memory); rows are appended to ``rows.jsonl`` as
they finish, so a run cut short keeps what it measured. ``--profile`` also records 5 steps of each
row with torch.profiler (harness/training/profiling.py) into ``profiles/MODEL-VARIANT``.

    python -m scripts.bench.single --out bench/results/DATE-DEVICE-single --nanogpt .nanogpt
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from scripts.bench.common import (ROOT, bench_record, device, median_step_ms, module_command, record_row, run_train,
                                  subprocess_env, write_json)

ROWS = {"resnet50": ("plain-eager", "plain-compile", "plain-compile-graph", "harness", "harness-compile"),
        "gpt-nanogpt": ("nanogpt", "plain-compile", "plain-compile-graph", "harness", "harness-compile"),
        "gpt-builtin": ("harness", "harness-compile"),
        "gpt-hf": ("hf-trainer", "hf-trainer-compile", "harness", "harness-compile")}
SAMPLES_PER_STEP = {"resnet50": 128, "gpt-nanogpt": 16 * 4, "gpt-builtin": 16 * 4, "gpt-hf": 16 * 4}
# nanoGPT's recipe. Its warm-up is the first 2000 of 600000 updates; a bench run is the first few dozen, and Train.py
# refuses a warm-up that its run never finishes, so Train.py warms up for 1 (the step runs the same kernels whatever
# the rate is; nanoGPT's own train.py keeps its 2000).
GPT_RECIPE = ["--batch-size", "16", "--grad-accum", "4", "--optimizer", "adamw", "--lr", "6e-4", "--weight-decay",
              "0.1", "--clip-grad", "1.0", "--amp", "bf16", "--lr-schedule", "cosine", "--warmup-steps", "1",
              "--min-lr", "6e-5"]


def plain_resnet50(variant: str, steps: int, profile: Path | None = None) -> dict:
    """The plain loop, in this process: (step_ms, first_step_s, peak_mb)."""
    import torch
    from harness.checkout.datasets import DataInfo
    from harness.checkout.models import build_model
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    model = build_model("resnet50", DataInfo("image", (3, 224, 224), 1000)).cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    x = torch.randn(128, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (128,), device="cuda")
    forward = {"plain-eager": model, "plain-compile": torch.compile(model),
               "plain-compile-graph": torch.compile(model, mode="reduce-overhead")}[variant]

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(forward(x), y)
        loss.backward()
        optimizer.step()

    return time_plain(step, steps, profile)


def plain_gpt(variant: str, steps: int, tokens: Path, profile: Path | None = None) -> dict:
    """nanoGPT's train.py reduced to its loop (its model with its own loss, configure_optimizers'
    fused AdamW, batch 16 x accumulation 4 x 1024, bf16, clip 1.0, the next batch copied while the
    GPU works), in this process; ``plain-compile-graph`` compiles with mode="reduce-overhead"."""
    import torch
    from scripts.bench.nanogpt_model import gpt2_124m, token_batches
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    model = gpt2_124m().cuda()
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cuda")
    forward = {"plain-compile": torch.compile(model),
               "plain-compile-graph": torch.compile(model, mode="reduce-overhead")}[variant]
    batch = token_batches(tokens, seed=0)
    following = [batch()]

    def step() -> None:
        for _ in range(4):
            x, y = following.pop()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                _, loss = forward(x, y)
            following.append(batch())
            (loss / 4).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return time_plain(step, steps, profile)


def time_plain(step: Callable[[], None], steps: int, profile: Path | None) -> dict:
    """The first step from the process's start, 10 warm-up steps, 5 profiled (with ``profile``), then
    ``steps`` timed between two synchronisations."""
    import torch
    from harness.control.timeline import process_started_at
    from harness.training.profiling import StepProfiler
    step()
    torch.cuda.synchronize()
    first = time.time() - process_started_at()
    profiler = StepProfiler(str(profile) if profile else None, 10, 5, torch.device("cuda"))
    for done in range(1, 16 if profile else 11):
        step()
        profiler.after(done)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return {"step_ms": (time.perf_counter() - start) / steps * 1000, "first_step_s": first,
            "peak_mb": torch.cuda.max_memory_reserved() / 2**20}


def harness_row(model: str, variant: str, steps: int, work: Path, tokens: Path, profile: Path | None = None,
                gpus: int = 1, images: int = 2048, extra: list[str] | None = None) -> dict:
    """Train.py as a user runs it, on ``gpus`` GPUs: step time from the first update's end to the last's
    (start-up and compilation left out), peak memory from rank 0's worker, the first step from the
    parent's start. ResNet-50 trains on ``images`` synthetic images, which Train.py keeps on the GPU."""
    flags = ["--gpus", ",".join(map(str, range(gpus))), "--max-steps", str(steps), "--save", "", *(["--compile"] if variant.endswith("compile") else []),
             *(["--profile", str(profile)] if profile else []), *(extra or [])]
    if model == "resnet50":
        flags += ["--model", "resnet50", "--dataset", "synthetic", "--dataset-options",
                  json.dumps({"shape": [3, 224, 224], "num_classes": 1000, "size": images}), "--val-fraction", "0",
                  "--batch-size", "128", "--amp", "bf16", "--lr", "0.1"]
    elif model == "gpt-hf":
        flags += ["--model", "hf-causal-lm", "--model-options", '{"model_type": "gpt2"}', "--dataset",
                  "scripts.bench.hf_tokens:windows", "--data-dir", str(tokens), *GPT_RECIPE]
    else:
        name = ["--model", "scripts.bench.nanogpt_model:gpt2"] if model == "gpt-nanogpt" else \
            ["--model", "gpt", "--model-options", '{"size": "124m", "bias": false}']
        flags += [*name, "--dataset", "tokens", "--data-dir", str(tokens), "--dataset-options",
                  '{"block_size": 1024, "vocab_size": 50257}', *GPT_RECIPE]
    records = run_train(flags, work / f"{model}-{variant}-{gpus}gpu", cwd=work)
    done = next(r for r in records if r["event"] == "done")
    startup = next(r for r in records if r["event"] == "startup")["parent"]
    return {"step_ms": median_step_ms(records), "first_step_s": startup["first_step"] - startup["process"],
            "peak_mb": done["peak_gpu_mb"]}


def nanogpt_row(steps: int, nanogpt: Path, tokens: Path, gpus: int = 1) -> dict:
    """nanoGPT's own train.py, compile on, nanoGPT's recipe at batch 16 x 4 per GPU (under torchrun on
    ``gpus`` > 1, which divides its accumulation steps by the GPU count); step time the median of its own
    per-iteration times after the first 10, peak memory read at each process's exit (the largest)."""
    data = nanogpt / "data" / "bench"
    data.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):
        target = data / f"{split}.bin"
        target.unlink(missing_ok=True)          # a link left by another run may point elsewhere, or nowhere
        target.symlink_to(tokens / f"{split}.bin")
    argv = ["train.py", "--dataset=bench", "--batch_size=16", f"--gradient_accumulation_steps={4 * gpus}", "--compile=True",
            f"--max_iters={steps}", "--eval_interval=1000000", "--eval_iters=1", "--log_interval=1",
            "--always_save_checkpoint=False", f"--out_dir={data / 'out'}"]
    # A file, as torchrun runs files; nanoGPT's folder first on sys.path, where train.py finds model.py.
    wrapper = ("import atexit, runpy, sys, torch; sys.path.insert(0, '.'); sys.argv = " + repr(argv) + "; "
               "atexit.register(lambda: print('PEAK_MB', torch.cuda.max_memory_reserved() / 2**20)); "
               "runpy.run_path('train.py', run_name='__main__')")
    (data / "run.py").write_text(wrapper)
    command = [sys.executable, "-u", str(data / "run.py")] if gpus == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}", str(data / "run.py")]
    started, first, lines = time.time(), None, []
    run = subprocess.Popen(command, cwd=nanogpt, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=subprocess_env())
    for line in run.stdout:
        lines.append(line)
        if first is None and line.startswith("iter 0:"):
            first = time.time() - started
    if run.wait() != 0:
        out = "".join(lines)       # from the first traceback: a worker's, not torchrun's own
        raise RuntimeError("nanoGPT's train.py failed:\n" + out[max(0, out.find("Traceback")):][:3000])
    out = "".join(lines)
    times = [float(m[1]) for m in re.finditer(r"^iter \d+: loss [\d.]+, time ([\d.]+)ms", out, re.M)]
    return {"step_ms": statistics.median(times[10:]), "first_step_s": first,
            "peak_mb": max(float(m[1]) for m in re.finditer(r"^PEAK_MB ([\d.]+)", out, re.M))}


def hf_trainer(variant: str, steps: int, tokens: Path, profile: Path | None = None) -> dict:
    """transformers' Trainer on GPT2LMHeadModel(GPT2Config()), the same windows and recipe, in this
    process, validating once at the end as Train.py does: the time from the end of update 10 to the last, synchronised at both ends. With
    ``profile``, updates 11 to 15 are recorded and the clock starts at update 20 instead."""
    import importlib.util
    import torch
    spec = importlib.util.find_spec("datasets")
    if spec is not None and spec.origin and Path(spec.origin).resolve().parent.parent == ROOT:
        sys.modules["datasets"] = None      # this checkout's registry, not Hugging Face's: the Trainer would take it for it
    import transformers
    from harness.control.timeline import process_started_at
    from harness.training.profiling import StepProfiler
    from scripts.bench.hf_tokens import windows
    marks: dict[int, float] = {}
    start = 20 if profile else 10
    profiler = StepProfiler(str(profile) if profile else None, 10, 5, torch.device("cuda"))

    class Clock(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            profiler.after(state.global_step)
            if state.global_step in (1, start, steps):
                torch.cuda.synchronize()
                marks[state.global_step] = time.time()

    arguments = transformers.TrainingArguments(
        output_dir=str(tokens.parent / "hf-trainer"), per_device_train_batch_size=16, gradient_accumulation_steps=4,
        learning_rate=6e-4, weight_decay=0.1, max_grad_norm=1.0, bf16=True, optim="adamw_torch_fused",
        lr_scheduler_type="cosine", warmup_steps=2000, max_steps=steps, logging_steps=10_000, save_strategy="no",
        report_to="none", torch_compile=variant == "hf-trainer-compile", dataloader_num_workers=4, disable_tqdm=True)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    trainer = transformers.Trainer(model=model, args=arguments, train_dataset=windows("train", str(tokens)),
                                   eval_dataset=windows("val", str(tokens)), callbacks=[Clock()])
    trainer.train()
    trainer.evaluate()      # the validation Train.py runs at the end of its run, so that both peaks include one
    return {"step_ms": (marks[steps] - marks[start]) / (steps - start) * 1000, "first_step_s": marks[1] - process_started_at(),
            "peak_mb": torch.cuda.max_memory_reserved() / 2**20}


def make_tokens(folder: Path) -> Path:
    """A token file as nanoGPT's prepare scripts write them (uint16), random, 8M tokens to train on."""
    import numpy as np
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for split, count in (("train", 8_000_000), ("val", 2 * 1025)):
        rng.integers(0, 50257, count, dtype=np.uint16).tofile(folder / f"{split}.bin")
    return folder


def run_row(model: str, variant: str, args: argparse.Namespace, tokens: Path) -> dict:
    steps = args.steps[model]
    profile = args.out / "profiles" / f"{model}-{variant}" if args.profile and variant != "nanogpt" else None
    if variant.startswith(("plain", "hf-trainer")):
        done = subprocess.run(module_command("scripts.bench.single", "--row", model, variant, "--steps",
                                             json.dumps(args.steps), "--out", str(args.out),
                                             *(["--profile"] if profile else [])),
                              capture_output=True, text=True, timeout=900, env=subprocess_env())
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-3000:])
        measured = json.loads(done.stdout.strip().splitlines()[-1])
    elif variant == "nanogpt":
        measured = nanogpt_row(steps, Path(args.nanogpt).resolve(), tokens)
    else:
        measured = harness_row(model, variant, steps, args.out, tokens, profile, images=args.images,
                               extra=shlex.split(args.train_flags))
        measured.update({"images": args.images} if model == "resnet50" else {})
        measured.update({"train_flags": args.train_flags} if args.train_flags else {})
    if profile and (profile / "profile.json").exists():
        measured["profile"] = json.loads((profile / "profile.json").read_text())
    return {"model": model, "variant": variant, **measured,
            "samples_per_s": SAMPLES_PER_STEP[model] / measured["step_ms"] * 1000, "device": device()}


def compare(rows: list[dict]) -> None:
    """vs_best_plain: samples/s over the best plain row of the model (nanoGPT's train.py for both GPT
    models); vs_nanogpt_model: the built-in GPT over nanoGPT's model in the same harness variant."""
    plain = {m: max((r["samples_per_s"] for r in rows if r["model"] == m and not r["variant"].startswith("harness")),
                    default=None) for m in ROWS}
    plain["gpt-builtin"] = plain["gpt-nanogpt"]         # gpt-hf's plain rows are transformers' Trainer
    for row in rows:
        best = plain[row["model"]]
        row["vs_best_plain"] = row["samples_per_s"] / best if best else None
        if row["model"] == "gpt-builtin":
            twin = next((r for r in rows if r["model"] == "gpt-nanogpt" and r["variant"] == row["variant"]), None)
            row["vs_nanogpt_model"] = row["samples_per_s"] / twin["samples_per_s"] if twin else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("bench-single"), help="folder for bench_single.json and the logs")
    p.add_argument("--models", default=",".join(ROWS), help=f"of {', '.join(ROWS)}")
    p.add_argument("--variants", default=None, help="only these variants (comma-separated)")
    p.add_argument("--nanogpt", default=".nanogpt", help="a checkout of karpathy/nanoGPT (for the nanogpt row)")
    p.add_argument("--steps", type=json.loads,
                   default={"resnet50": 300, "gpt-nanogpt": 40, "gpt-builtin": 40, "gpt-hf": 40},
                   help="timed updates per model, as JSON")
    p.add_argument("--images", type=int, default=2048,
                   help="synthetic images Train.py's ResNet-50 rows train on, kept on the GPU (the plain loops "
                        "train on one batch of 128): 2048 (1.2 GB) or, for a memory figure on the plain loops' "
                        "footing, a batch or two")
    p.add_argument("--train-flags", default="", help="more Train.py flags for the harness rows, one string "
                                                    "(--train-flags='--no-tf32 ...'); the rows record them")
    p.add_argument("--profile", action="store_true",
                   help="also record 5 steps of each row with torch.profiler (Train.py --profile; the same summary "
                        "for plain loops) into OUT/profiles/MODEL-VARIANT, and add its summary to the row")
    p.add_argument("--row", nargs=2, metavar=("MODEL", "VARIANT"), help=argparse.SUPPRESS)   # one plain row, here
    args = p.parse_args()
    if args.row:
        model, variant = args.row
        profile = args.out.resolve() / "profiles" / f"{model}-{variant}" if args.profile else None
        tokens = args.out.resolve() / "tokens"
        row = hf_trainer(variant, args.steps[model], tokens, profile) if model == "gpt-hf" else \
            plain_gpt(variant, args.steps[model], tokens, profile) if model == "gpt-nanogpt" else \
            plain_resnet50(variant, args.steps[model], profile)
        print(json.dumps(row))
        return
    args.out = args.out.resolve()
    os.environ["NANOGPT_DIR"] = str(Path(args.nanogpt).resolve())
    tokens = make_tokens(args.out / "tokens")
    rows = []
    for model in args.models.split(","):
        for variant in ROWS[model]:
            if args.variants and variant not in args.variants.split(","):
                continue
            record_row(rows, args.out, {"model": model, "variant": variant}, lambda: run_row(model, variant, args, tokens))
    compare([r for r in rows if "error" not in r])
    write_json(args.out / "bench_single.json", bench_record(rows=rows))


if __name__ == "__main__":
    main()
