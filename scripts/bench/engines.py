"""Train.py started by each cluster engine against Train.py's own ssh launch: time to first step, same result.

The hosts are Linux network namespaces on this machine with their own sshd and a Slurm cluster over them
(tests/helpers/netns_hosts.py; needs root), and the engines are started as tests/helpers/engines.py starts
them: torchrun in each namespace (c10d rendezvous on node 0), a PyTorchJob's master and worker pods (the
operator's variables, the master's name resolvable), an sbatch script's ``srun --ntasks-per-node=1`` step,
and Open MPI's ``mpirun`` over the namespaces' sshd. Each runs the same job on two nodes, one CPU worker
each, as ``Train.py --launcher ssh --hosts A:1,B:1`` (started as a command from this machine) does.

Two clocks per run: ``first_step_s``, node 0's Train.py from its process start to the end of the first
update (its metrics.jsonl ``startup`` record: what the harness itself takes, under the engine or over
ssh), and ``from_launch_s``, from the moment the engine (or the ssh launch) is started here to that
first update (the engine's own start included: torchrun's rendezvous, Slurm's scheduling). The variants
alternate, ``--repeats`` times; every run's final parameters are compared with the first ssh run's.

    sudo python -m scripts.bench.engines --repeats 3 --out bench/results/DATE-DEVICE/engines
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from scripts.bench.common import ROOT, bench_record, write_json
from tests.helpers.engines import Job, PyTorchJob, Torchrun, key_file, mpirun
from tests.helpers.netns_hosts import Hosts, why_no_slurm, why_not

JOB = ["--max-steps", "30", "--batch-size", "16", "--seed", "4"]      # tests/test_agents.py's job
TIMEOUT = 180


def ssh(hosts: Hosts, folder: Path, flags: list[str], slurm: dict) -> None:
    command = [sys.executable, str(ROOT / "Train.py"), *flags, "--launcher", "ssh", "--hosts",
               ",".join(f"{a}:1" for a in hosts.addresses[:2])]
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=TIMEOUT,
                          env={**os.environ, "HARNESS_SSH": hosts.ssh})
    if done.returncode:
        raise RuntimeError(f"ssh launch exited {done.returncode}:\n{done.stderr[-3000:]}")


def torchrun(hosts: Hosts, folder: Path, flags: list[str], slurm: dict) -> None:
    statuses = Torchrun(hosts, folder, *flags, "--cpu-workers", "1", nodes=2).wait(TIMEOUT)
    if statuses != [0, 0]:
        raise RuntimeError(f"torchrun exited {statuses}")


def kubeflow(hosts: Hosts, folder: Path, flags: list[str], slurm: dict) -> None:
    job = PyTorchJob(hosts, folder, *flags, "--cpu-workers", "1")
    try:
        job.resolve(1)
        job.start(0)
        job.start(1)
        statuses = job.wait(TIMEOUT)
    finally:
        job.close()
    if statuses != [0, 0]:
        raise RuntimeError(f"the pods exited {statuses}:\n{job.tail()}")


def slurm_step(hosts: Hosts, folder: Path, flags: list[str], slurm: dict) -> None:
    job = Job(slurm, folder, *flags, "--cpu-workers", "1", per_node=1, nodes=2, step=True,
              env={"HARNESS_KEY_FILE": str(key_file(folder))})
    status = job.wait(TIMEOUT)
    if status:
        raise RuntimeError(f"the sbatch job exited {status}:\n{job.tail()}")


def mpi(hosts: Hosts, folder: Path, flags: list[str], slurm: dict) -> None:
    done = mpirun(hosts, folder, *flags, "--cpu-workers", "1")
    if done.returncode:
        raise RuntimeError(f"mpirun exited {done.returncode}:\n{done.stderr[-3000:]}")


VARIANTS: dict[str, Callable[[Hosts, Path, list[str], dict], None]] = {
    "ssh": ssh, "torchrun": torchrun, "kubeflow": kubeflow, "slurm": slurm_step, "mpi": mpi}


def timed(name: str, hosts: Hosts, folder: Path, slurm: dict) -> dict:
    """One run of ``name`` into ``folder``: its two clocks and where its checkpoint is."""
    folder.mkdir(parents=True)
    save, logs = folder / "model.pt", folder / "logs"
    launched = time.time()
    VARIANTS[name](hosts, folder, [*JOB, "--save", str(save), "--log-dir", str(logs)], slurm)
    records = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    startup = next(r for r in records if r["event"] == "startup")
    parent = startup["parent"]
    return {"variant": name, "first_step_s": parent["first_step"] - parent["process"],
            "from_launch_s": parent["first_step"] - launched, "save": save,
            "marks_s": {"parent": {k: round(v - parent["process"], 3) for k, v in parent.items()},
                        "workers": [{k: round(v - parent["process"], 3) for k, v in w.items()}
                                    for w in startup["workers"]]}}


def flat(path: Path):
    from tests.helpers.training import flat_params
    return flat_params(path)


def summary(rows: list[dict]) -> dict:
    """Per variant: the medians of both clocks, and their ratio to the ssh launch's."""
    medians = {name: {clock: statistics.median(r[clock] for r in rows if r["variant"] == name)
                      for clock in ("first_step_s", "from_launch_s")} for name in VARIANTS}
    return {name: {**m, **{f"{clock}_vs_ssh": m[clock] / medians["ssh"][clock] for clock in m}}
            for name, m in medians.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write bench_engines.json here")
    args = parser.parse_args()
    reason = why_not() or why_no_slurm()
    if reason:
        sys.exit(f"scripts.bench.engines: cannot make the namespaced hosts and their Slurm cluster here: {reason}")
    rows: list[dict] = []
    reference = None        # the parameters of the first run, ssh's (the first of VARIANTS)
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        hosts = Hosts(Path(tmp))
        try:
            slurm = hosts.start_slurm()
            for repeat in range(args.repeats):
                for name in VARIANTS:
                    row = timed(name, hosts, Path(tmp) / f"{name}-{repeat}", slurm)
                    params = flat(row.pop("save"))
                    reference = params if reference is None else reference
                    row["equals_ssh"] = bool((params == reference).all())
                    rows.append(row)
                    print(f"run {repeat + 1}/{args.repeats} {name}: first step {row['first_step_s']:.2f} s after "
                          f"Train.py started, {row['from_launch_s']:.2f} s after the launch; equals ssh's: "
                          f"{row['equals_ssh']}", flush=True)
        finally:
            hosts.close()
    result = summary(rows)
    for name, m in result.items():
        print(f"{name:9s} first step {m['first_step_s']:.2f} s ({m['first_step_s_vs_ssh']:.2f}x ssh's), from launch "
              f"{m['from_launch_s']:.2f} s ({m['from_launch_s_vs_ssh']:.2f}x)")
    if args.out:
        write_json(args.out / "bench_engines.json", bench_record(nodes=2, workers_per_node=1, rows=rows, median=result))


if __name__ == "__main__":
    main()
