"""The harness's input pipelines against a GPU-resident ceiling and against the recipe users copy.

A run trains only as fast as its input pipeline feeds it. This benchmark trains ResNet-50 on a folder
of ImageNet-like JPEGs (`--dataset imagefolder`: decoded and augmented by the harness's data
workers) and GPT-2 124M on nanoGPT token files (`--dataset tokens`), each against the same model on
a synthetic dataset kept on the GPU, which costs no input work: the ceiling (`of_ceiling` is the
share of it a row reaches). ResNet-50 also runs under torchrun + DDP with torchvision's ImageFolder
DataLoader, as PyTorch's ImageNet example does (scripts/bench/ddp_imagefolder.py): the baseline to beat.
Tokens are read from a 5 GB and a 0.25 GB file, to show whether worker memory grows with the file.

Each row is one command, timed as a user would meet it: samples/s over the last two thirds of the
steps, seconds from the command to the end of rank 0's first step, and the memory of the largest
worker with its data-loader processes (proportional set size, so shared pages are not counted
twice), as Train.py reports it (`worker_rss_mb`) and as sampled here from /proc every 0.5 s
(`worker_pss_mb`, of which `worker_pss_file_mb` is mapped file pages: page cache, not copies).
The data is made first (scripts/bench/make_data.py) and reused by later runs.

    python -m scripts.bench.data --gpus 4 --out bench/results/DATE-DEVICE/data
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from scripts.bench.common import ROOT, bench_record, module_command, subprocess_env, train_command, write_json
from scripts.bench.make_data import make_jpeg_folder, make_token_files
from scripts.bench.processes import kill_tree, worker_pss_mb

PARTS = ("jpeg", "resident", "torchrun", "tokens")
SMALL_TOKENS_GB = 0.25
MODELS = {"resnet50": ["--model", "resnet50"], "gpt2-124m": ["--model", "gpt", "--model-options", '{"size": "124m"}']}
RESIDENT = {   # synthetic datasets small enough for the harness to keep on the GPU
    "resnet50": {"shape": [3, 224, 224], "num_classes": 1000, "size": 4096},
    "gpt2-124m": {"tokens": True, "seq_len": 1024, "vocab_size": 50257, "size": 512}}
COLOURS = {"gpu-resident": "#999", "jpeg": "#2a7", "tokens": "#2a7", "torchrun-dataloader": "#d73"}


# -- what to run ---------------------------------------------------------------------------------

def plan(args: argparse.Namespace, n: int) -> list[dict]:
    """The rows, in order: each model's ceiling first."""
    def train(name: str, model: str, source: str, dataset: list[str], **extra) -> dict:
        batch, steps = (args.batch_size, args.resnet_steps) if model == "resnet50" else (args.gpt_batch, args.gpt_steps)
        command = train_command("--gpus", ",".join(map(str, range(n))), *MODELS[model],
                                "--amp", "bf16", "--batch-size", str(batch), *dataset, "--max-steps", str(steps),
                                "--save", "", "--validate-every", str(steps + 1),   # never, as in the baseline
                                "--log-dir", str(args.out / "logs" / name))
        return {"name": name, "model": model, "source": source, "batch": batch, "steps": steps, **extra,
                "command": command, "marker": "harness.child"}

    def resident(model: str) -> dict:
        return train(f"{model}-gpu-resident", model, "gpu-resident", ["--dataset", "synthetic", "--dataset-options",
                     json.dumps(RESIDENT[model]), "--val-fraction", "0"])

    rows, workers = [], [] if args.data_workers is None else ["--data-workers", str(args.data_workers)]
    if "resident" in args.parts:
        rows.append(resident("resnet50"))
    if "jpeg" in args.parts:
        for decoder in args.decoders:
            suffix, decoder = ("", None) if decoder == "default" else (f"-{decoder}", decoder)
            options = ["--dataset-options", json.dumps({"decoder": decoder})] if decoder else []
            rows.append(train(f"resnet50-jpeg{suffix}", "resnet50", "jpeg", ["--dataset", "imagefolder", "--data-dir",
                              str(args.data / "jpeg"), *options, *workers], data_workers=args.data_workers,
                              decoder=decoder or "default"))
    if "torchrun" in args.parts:
        per_gpu = args.data_workers if args.data_workers is not None else max(1, os.cpu_count() // n - 2)
        steps = args.resnet_steps
        command = module_command("torch.distributed.run", "--standalone", "--nproc_per_node", str(n),
                                 "-m", "scripts.bench.ddp_imagefolder", "--data", str(args.data / "jpeg"),
                                 "--batch-size", str(args.batch_size), "--workers", str(per_gpu), "--steps", str(steps),
                                 "--warmup", str(steps // 3))
        rows.append({"name": "resnet50-torchrun-dataloader", "model": "resnet50", "source": "torchrun-dataloader",
                     "batch": args.batch_size, "steps": steps, "data_workers": per_gpu, "command": command,
                     "marker": "scripts.bench.ddp_imagefolder"})
    if "resident" in args.parts:
        rows.append(resident("gpt2-124m"))
    if "tokens" in args.parts:
        for suffix, folder, gb in (("", "tokens", args.train_gb), ("-small", "tokens-small", SMALL_TOKENS_GB)):
            rows.append(train(f"gpt2-124m-tokens{suffix}", "gpt2-124m", "tokens", ["--dataset", "tokens", "--data-dir",
                              str(args.data / folder), "--dataset-options", '{"block_size": 1024}'], file_gb=gb))
    return rows


def make_data(args: argparse.Namespace) -> dict:
    stats = {}
    if {"jpeg", "torchrun"} & set(args.parts):
        stats["jpeg"] = make_jpeg_folder(args.data / "jpeg", images=args.images)
    if "tokens" in args.parts:
        stats["tokens"] = make_token_files(args.data / "tokens", train_gb=args.train_gb)
        stats["tokens-small"] = make_token_files(args.data / "tokens-small", train_gb=SMALL_TOKENS_GB)
    return stats


# -- one row -------------------------------------------------------------------------------------

def json_lines(text: str) -> list[dict]:
    records = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            records.append(json.loads(line))
    return [r for r in records if isinstance(r, dict)]


def train_figures(metrics: Path, t0: float, batch: int, gpus: int, steps: int) -> dict:
    """From Train.py's metrics.jsonl: samples/s between the first step record at or after a third
    of the steps and the last one, seconds from t0 to the first step, and the largest rss_mb."""
    records = json_lines(metrics.read_text()) if metrics.exists() else []
    first = next((r for r in records if r.get("event") == "first_step"), None)
    stepped = [r for r in records if r.get("event") == "step"]
    a = next((r for r in stepped if r["step"] >= steps / 3), None)
    b = stepped[-1] if stepped else None
    rate = (b["step"] - a["step"]) * batch * gpus / (b["time"] - a["time"]) if a and b["step"] > a["step"] else None
    rss = [r["rss_mb"] for r in stepped if r.get("rss_mb") is not None]
    return {"samples_per_s": rate, "first_step_s": first["time"] - t0 if first else None,
            "worker_rss_mb": max(rss, default=None), "steps_done": b["step"] if b else None}


def torchrun_figures(log: Path, t0: float) -> dict:
    """From the JSON line scripts/bench/ddp_imagefolder.py prints at the end."""
    found = [r for r in json_lines(log.read_text(errors="replace")) if "first_step_time" in r]
    if not found:
        return dict.fromkeys(("samples_per_s", "first_step_s", "steps_done"))
    return {"samples_per_s": found[-1]["samples_per_s"], "first_step_s": found[-1]["first_step_time"] - t0,
            "steps_done": found[-1]["steps"]}


def measure(row: dict, n: int, out: Path, timeout: float) -> dict:
    """Run a row's command (stdout and stderr to OUT/logs/NAME.log), sampling its workers' memory."""
    shutil.rmtree(out / "logs" / row["name"], ignore_errors=True)     # Train.py appends to metrics.jsonl
    log = out / "logs" / f"{row['name']}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    peak, timed_out = (0.0, 0.0), False
    with log.open("wb") as sink:
        t0 = time.time()
        process = subprocess.Popen(row["command"], cwd=ROOT, env=subprocess_env(), stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        while process.poll() is None:
            peak = max(peak, worker_pss_mb(process.pid, row["marker"]))
            if time.time() - t0 > timeout:
                timed_out = True
                kill_tree(process)
                break
            time.sleep(0.5)
    returncode, (pss, pss_file) = process.wait(), (round(mb, 1) or None for mb in peak)
    if row["source"] == "torchrun-dataloader":
        figures = {**torchrun_figures(log, t0), "worker_rss_mb": pss}
    else:
        figures = train_figures(out / "logs" / row["name"] / "metrics.jsonl", t0, row["batch"], n, row["steps"])
    if returncode != 0:
        figures = dict.fromkeys(figures)
        (out / f"{row['name']}.log").write_text(log.read_text(errors="replace")[-6000:])
    kept = {k: v for k, v in row.items() if k not in ("command", "marker")}
    return {**kept, "gpus": n, **figures, "worker_pss_mb": pss, "worker_pss_file_mb": pss_file, "of_ceiling": None,
            "returncode": returncode, "timed_out": timed_out, "seconds": round(time.time() - t0, 1),
            "log": f"logs/{row['name']}.log", "command": shlex.join(row["command"])}


# -- report --------------------------------------------------------------------------------------

def set_ceiling_ratios(rows: list[dict]) -> None:
    ceiling = {r["model"]: r["samples_per_s"] for r in rows if r["source"] == "gpu-resident" and r["samples_per_s"]}
    for r in rows:
        found = r["samples_per_s"] and ceiling.get(r["model"])
        r["of_ceiling"] = r["samples_per_s"] / found if found else None


def label(row: dict) -> str:
    if "file_gb" in row:
        return f"{row['source']} {row['file_gb']:g} GB"
    return f"{row['source']} {row['decoder']}" if row.get("decoder") else row["source"]


def markdown(rows: list[dict]) -> str:
    def f(value, spec: str) -> str:
        return "–" if value is None else format(value, spec)
    lines = ["| model | GPUs | source | data workers | samples/s | of ceiling | first step (s) | worker MB (Train.py) "
             "| worker MB (/proc; file pages) | exit |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['gpus']} | {label(r)} | {f(r.get('data_workers'), 'd')} | "
              f"{f(r['samples_per_s'], ',.0f')} | {f(r['of_ceiling'], '.1%')} | {f(r['first_step_s'], '.1f')} | "
              f"{f(r['worker_rss_mb'], ',.0f')} | {f(r['worker_pss_mb'], ',.0f')}; "
              f"{f(r['worker_pss_file_mb'], ',.0f')} | {r['returncode']} |" for r in rows]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    """One samples/s panel per model (of_ceiling on each bar), and one of time to first step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models) + 1, figsize=(4.2 * (len(models) + 1), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in rows if r["model"] == model]
        bars = ax.bar([label(r) for r in mine], [r["samples_per_s"] or 0 for r in mine],
                      color=[COLOURS[r["source"]] for r in mine])
        ax.bar_label(bars, labels=["failed" if r["samples_per_s"] is None else
                                   f"{r['of_ceiling']:.0%}" if r["of_ceiling"] is not None else "" for r in mine])
        ax.set_title(f"{model}, {mine[0]['gpus']} GPU{'s' if mine[0]['gpus'] > 1 else ''}")
        ax.set_ylabel("images/s" if model == "resnet50" else "sequences/s")
    timed = [r for r in rows if r["first_step_s"] is not None]
    bars = axes[0][-1].bar([f"{r['model']}\n{label(r)}" for r in timed], [r["first_step_s"] for r in timed],
                           color=[COLOURS[r["source"]] for r in timed])
    axes[0][-1].bar_label(bars, fmt="%.1f")
    axes[0][-1].set(title="command to first step", ylabel="seconds")
    for ax in axes[0]:
        ax.tick_params(axis="x", rotation=60, labelsize=8)
        ax.margins(y=0.12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(record: dict, out: Path) -> None:
    set_ceiling_ratios(record["rows"])
    write_json(out / "bench_data.json", record)
    (out / "bench_data.md").write_text(markdown(record["rows"]))
    plot(record["rows"], out / "bench_data.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, help="use GPUs 0..N-1 (default: every visible GPU)")
    parser.add_argument("--data", type=Path, default=Path("/tmp/harness-bench-data"), help="made here if missing")
    parser.add_argument("--out", type=Path, default=Path("bench/results/data"), help="results folder")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="'resident' runs both models' GPU-resident ceilings")
    parser.add_argument("--decoders", nargs="+", choices=("default", "simplejpeg", "pillow"),
                        default=["default", "simplejpeg", "pillow"], help="a jpeg row for each")
    parser.add_argument("--images", type=int, default=50_000, help="JPEGs in the training folder")
    parser.add_argument("--train-gb", type=float, default=5.0, help="size of the large train.bin")
    parser.add_argument("--resnet-steps", type=int, default=150)
    parser.add_argument("--gpt-steps", type=int, default=60)
    parser.add_argument("--data-workers", type=int, help="data workers per GPU (default: Train.py's own; "
                        "torchrun: CPUs / GPUs - 2)")
    parser.add_argument("--batch-size", type=int, default=128, help="ResNet-50 images per GPU")
    parser.add_argument("--gpt-batch", type=int, default=16, help="GPT-2 sequences per GPU")
    parser.add_argument("--timeout", type=float, default=300, help="seconds before a row is killed")
    args = parser.parse_args()
    if args.gpus is None:
        import torch
        args.gpus = torch.cuda.device_count()
    if args.gpus < 1:
        parser.error("no GPU visible; pass --gpus N")
    args.out.mkdir(parents=True, exist_ok=True)
    record = bench_record(gpus=args.gpus, data=make_data(args), rows=[])
    print(f"data: {json.dumps(record['data'])}", flush=True)
    for row in plan(args, args.gpus):
        print(f"{row['name']}: {shlex.join(row['command'])}", flush=True)
        record["rows"].append(measure(row, args.gpus, args.out, args.timeout))
        write(record, args.out)
        if record["rows"][-1]["returncode"] != 0:
            print(f"  failed ({record['rows'][-1]['returncode']}): {args.out / (row['name'] + '.log')}", flush=True)
    print(markdown(record["rows"]), end="")


if __name__ == "__main__":
    main()
