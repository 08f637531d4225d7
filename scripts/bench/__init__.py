"""Benchmarks: this harness side by side with the usual alternative, on the same machine in the same run.

Each is ``python -m scripts.bench.NAME --help`` from the checkout root. Those that write results
write JSON (and a PNG) that records the command, the date and the device (``common.bench_record``);
results worth keeping go to bench/results/DATE-DEVICE-WHAT/ with a README.md giving the command.

    allreduce         all-reduce bus bandwidth and latency against torch.distributed (GPUs)
    vs_ddp            training step against DDP: ceiling, bucketed, flat, graphed, param mode (GPUs)
    recipe            a modern recipe (compile, accumulation, fused AdamW) against nanoGPT's DDP loop (GPUs)
    step_host_time    per rank, host time against wall time per step: what each kind of sync costs (GPUs)
    workers_per_gpu   samples/s with K workers per GPU, with and without MPS (GPUs)
    checkpoint        Train.py with and without frequent background checkpoints
    torchrun_restart  torchrun + DDP's restart after a SIGKILL, beside healing in place (GPUs)
    control           control plane: join/yield latency and array throughput against multiprocessing
    hosts             time to first step across hosts (network namespaces, ssh) against torchrun (root)
    engines           Train.py started by torchrun, PyTorchJob pods, an srun step, mpirun against its ssh launch (root)
    data              the input pipelines against a GPU-resident ceiling and torchrun's DataLoader (GPUs)
    decode            images/s per JPEG decoder on one CPU core (a loader process's share)
    single            one GPU: the step against plain loops with torch.compile, nanoGPT's train.py, HF's Trainer
    attention         scaled_dot_product_attention's kernels at GPT-2's shapes: which runs, how fast (GPUs)
    multi             several GPUs: the step against torchrun + DDP with torch.compile and nanoGPT under torchrun
    zero              --zero 0, 1 and 2: memory per worker and step time (CPU workers, or GPUs; with --peers
                      against DDP, ZeroRedundancyOptimizer and FSDP2 under torchrun)
    slow_link         grad, param averaging, DiLoCo, streaming, async over a 20 Mbit/s link (namespaces, tc; root)
    make_data         the data ``data`` and ``decode`` run on: ImageNet-like JPEGs, nanoGPT token files
    ddp_imagefolder   the baseline ``data`` runs under torchrun: PyTorch's ImageNet example's loader
    peers             the baselines ``multi`` and ``zero`` run under torchrun: DDP (compiled), ZeRO, FSDP2
    nanogpt_model     nanoGPT's model.py as a harness model (--model scripts.bench.nanogpt_model:gpt2)

Shared pieces: ``common`` (models, timing, records, Train.py and module subprocesses, charts) and
``processes`` (a command's process tree and memory, from /proc).
"""
