"""User tools beside the harness: demos, a start-up report, the healing soak, benchmarks, MPS and GPU checks.

Run from the checkout root, with the project installed (``pip install -e .``), as modules:
``python -m scripts.NAME --help``. Nothing here edits ``sys.path``: ``python -m`` puts the checkout
root on it, and the harness's workers inherit it.

Python tools (``python -m scripts.NAME``):
    parallel_demo      the Lua ``parallel`` examples: fork, exec, a yield/join loop, send/receive
    collectives_demo   port of parallel-nccl.lua: every collective, expected against received
    startup_timeline   where a run's start-up went, per process and phase (from LOG_DIR/metrics.jsonl)
    soak_heal          kills and stops workers of a running Train.py at random moments; heal figures
    suite_cpu          a pytest plugin (-p scripts.suite_cpu): each test's CPU over the whole machine, and wall time
    bench.*            the benchmarks (scripts/bench/__init__.py lists them)

Shell tools (``bash scripts/NAME.sh``; ``--help`` on each):
    init_mps_for_gpus.sh, stop_mps_for_gpus.sh, set_mps_env_for_gpus.sh GPUS   one MPS daemon per GPU group
    init_mps_for_all_gpus.sh, stop_mps_for_all_gpus.sh, set_mps_env_for_all_gpus.sh   the same for every GPU
    gpu_checks.sh [collectives|train|data|shared|startup|mps|all]   the GPU tests and benchmarks on a GPU
                       machine (its header says how it is run on the lent device)
"""
