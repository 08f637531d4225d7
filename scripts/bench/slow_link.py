"""Training across a slow link: gradient averaging, parameter averaging, DiLoCo (fp32 and bf16 deltas,
streamed) and the asynchronous server, on two hosts whose links carry 20 Mbit/s each way (issue 35).

The hosts are network namespaces on this machine, each with its own sshd (tests/helpers/netns_hosts.py,
as the CI tests make them; needs root). Each host's link is limited with ``tc`` (a token bucket on both
ends of its veth, so each way; netem's delay only with ``--delay-ms`` and a kernel that has netem).
Each host's sshd is pinned to a core of its own with taskset, so the one worker its session starts
runs on that core, and host N-1's sshd sits in a CPU cgroup whose quota holds it to half a core for
the throttled rows (cgroup v1 ``cpu.cfs_quota_us``, v2 ``cpu.max``). Every row is one
``Train.py --launcher ssh --hosts A:1,B:1`` on the same byte-level token file (this checkout's .py
and .md files, one token per byte, uint16), the built-in GPT at its tiny size, AdamW, the same
per-worker batch and the same number of samples; only the synchronisation flags differ.

Rows (``bench_slow_link.json``, ``rows``): ``variant``, ``link_mbit``, ``throttled``, ``samples``,
``final_val_loss``, ``wall_s`` (launch to exit), ``time_to_target_s`` (launch to the first validation
at or below 1.02 x grad mode's final loss; null if never), ``bytes_sent`` (what the hosts put on
their links, from the bridge ends' rx_bytes: worker to worker and worker to parent),
``blocked_frac`` (outer_sync records' blocked_s over wall_s, per worker), ``max_staleness_seen``, on async rows
``time_to_diloco_s`` and ``x_diloco_wall`` (to the final loss of the DiLoCo row with the same throttling,
and that over DiLoCo's wall-clock), ``startup_s``
(launch to the first update), ``val_curve`` ([seconds since launch, val_loss]) and ``command``.
A variant whose flags Train.py refuses is a row with ``error``, its one-line refusal. Rows already
in ``--out``'s file, measured with the same settings, are kept unless run again, so variants that
land later can be added to the same table. Namespaces, qdiscs, the cgroup and every process go
away at the end, on an error, on Ctrl-C and on SIGTERM.

    python -m scripts.bench.slow_link --out bench/results/DATE-cpu2-slow-link
    python -m scripts.bench.slow_link --out DIR --variants grad,param-average --throttled-variants ''
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from scripts.bench.common import ROOT, bench_record, train_command, write_json
from tests.helpers.netns_hosts import Hosts, why_not

RESULT = "bench_slow_link.json"
TARGET_FACTOR = 1.02                 # time to target: to 1.02 x grad mode's final validation loss
VAL_SPLIT = 0.9                      # the first 90% of the text trains, the rest validates
KILL_GRACE_S = 10                    # a Train.py we stop gets this long after SIGTERM before SIGKILL
VARIANT_NAMES = ("grad", "param-average", "diloco", "diloco-bf16", "streaming", "async", "async-bf16")


def variant_flags(name: str, k: int, async_delay: int = 0) -> list[str]:
    """The synchronisation flags of a variant: K inner updates between syncs, DiLoCo's outer Nesterov
    (lr 0.7, momentum 0.9) as the paper sets it; async's workers train on under a push for up to
    ``async_delay`` updates (--outer-delay)."""
    diloco = ["--mode", "param", "--avg-every", str(k), "--outer-optimizer", "nesterov", "--outer-lr", "0.7",
              "--outer-momentum", "0.9"]
    asynchronous = ["--mode", "async", "--max-staleness", "1", *diloco[2:],
                    *(["--outer-delay", str(async_delay)] if async_delay else [])]
    return {
        "grad": ["--mode", "grad"],
        "param-average": ["--mode", "param", "--avg-every", str(k)],
        "diloco": diloco,
        "diloco-bf16": [*diloco, "--outer-dtype", "bf16"],
        "streaming": [*diloco, "--fragments", "4", "--outer-delay", "5"],
        "async": asynchronous,
        "async-bf16": [*asynchronous, "--outer-dtype", "bf16"],
    }[name]


def validation_interval(variant: str, every: int, k: int) -> int:
    """Updates between validations: ``every``, except for param-average, which validates at its syncs
    only (the first multiple of K at or above ``every``): its validation averages the replicas
    (ParameterAveraging.finish), so validating between syncs would be syncing more often than K."""
    return k * math.ceil(every / k) if variant == "param-average" else every


# -- the pure parts: what a run's records and output say -----------------------------------------

def val_curve(records: list[dict], launched: float) -> list[list[float]]:
    """[seconds since launch, val_loss] of each validation record, in order."""
    return [[r["time"] - launched, r["val_loss"]] for r in records
            if r.get("event") == "validation" and r.get("val_loss") is not None]


def time_to_target(curve: list[list[float]], target: float | None) -> float | None:
    """Seconds to the first validation at or below ``target``; None if never or without a target."""
    if target is None:
        return None
    return next((seconds for seconds, loss in curve if loss <= target), None)


def outer_sync_figures(records: list[dict], wall_s: float) -> tuple[float | None, int | None]:
    """(blocked_frac, max_staleness_seen) from the outer_sync records (and any record that carries a
    staleness); None where a run logged none, as modes without outer syncs do. blocked_frac is a worker's share
    of the wall-clock stood still for exchanges, the mean over the workers whose records there are (async mode
    logs every worker's, param mode rank 0's)."""
    syncs = [r for r in records if r.get("event") == "outer_sync"]
    workers = len({r.get("rank", 0) for r in syncs})
    blocked = sum(r.get("blocked_s") or 0.0 for r in syncs) / workers / wall_s if syncs else None
    staleness = [r["staleness"] for r in records if r.get("staleness") is not None]
    return blocked, max(staleness) if staleness else None


def refusal(output: str) -> str:
    """The line a failed Train.py ended on (its one-line refusal of a flag it does not know)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def with_targets(rows: list[dict]) -> tuple[float | None, list[dict]]:
    """The target (1.02 x the unthrottled grad row's final loss) and every row's time to it; async rows also
    their time to the final loss of synchronous DiLoCo's row with the same throttling, and that over its wall
    (the asynchronous server's goal: <= 0.8)."""
    grad = next((r for r in rows if r["variant"] == "grad" and not r["throttled"]
                 and r.get("final_val_loss") is not None), None)
    target = TARGET_FACTOR * grad["final_val_loss"] if grad else None
    rows = [{**r, "time_to_target_s": time_to_target(r.get("val_curve") or [], target)} for r in rows]
    return target, [{**r, **against_diloco(r, rows)} if r["variant"].startswith("async") else r for r in rows]


def against_diloco(row: dict, rows: list[dict]) -> dict:
    """``time_to_diloco_s`` and ``x_diloco_wall`` of an async row against the DiLoCo row with its throttling and
    its --outer-dtype (async-bf16: diloco-bf16; None without a row to match)."""
    diloco = next((r for r in rows if r["variant"] == row["variant"].replace("async", "diloco")
                   and r["throttled"] == row["throttled"]
                   and r.get("final_val_loss") is not None), None)
    seconds = time_to_target(row.get("val_curve") or [], diloco["final_val_loss"]) if diloco else None
    return {"time_to_diloco_s": seconds, "x_diloco_wall": seconds / diloco["wall_s"] if seconds else None}


def merge_rows(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` with the rows of ``new`` in place of those of the same variant and throttling, then the
    rest of ``new``: a later run of some variants updates the table it joins."""
    fresh = {(r["variant"], r["throttled"]): r for r in new}
    kept = [fresh.pop((r["variant"], r["throttled"]), r) for r in old]
    return kept + list(fresh.values())


def format_table(rows: list[dict]) -> str:
    """The rows as a fixed-width table (what the README copies)."""
    def cell(value: object, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    lines = [f"{'variant':<14} {'throttled':>9} {'samples':>7} {'val loss':>8} {'wall s':>7} {'to target s':>11} "
             f"{'MB sent':>8} {'blocked':>7} {'stale':>5} {'x diloco':>8}"]
    for r in rows:
        if r.get("error"):
            lines.append(f"{r['variant']:<14} {str(r['throttled']):>9} {r['samples']:>7}  error: {r['error']}")
            continue
        mb = r["bytes_sent"] / 1e6 if r.get("bytes_sent") is not None else None
        lines.append(f"{r['variant']:<14} {str(r['throttled']):>9} {r['samples']:>7} "
                     f"{cell(r['final_val_loss'], '8.4f')} {cell(r['wall_s'], '7.1f')} "
                     f"{cell(r['time_to_target_s'], '11.1f')} {cell(mb, '8.2f')} "
                     f"{cell(r['blocked_frac'], '7.3f')} {cell(r['max_staleness_seen'], '5d')} "
                     f"{cell(r.get('x_diloco_wall'), '8.3f')}")
    return "\n".join(lines)


# -- the data -------------------------------------------------------------------------------------

def git(*args: str, given: bytes | None = None) -> bytes:
    """A git command's output in the checkout."""
    return subprocess.run(["git", *args], cwd=ROOT, input=given, capture_output=True, check=True).stdout


def committed_text(commit: str) -> tuple[list[str], bytes]:
    """The .py and .md files of ``commit``, sorted, and their text concatenated. Read from the commit,
    not the working tree that others edit meanwhile, so that rows run later train on the same text."""
    names = sorted(name for name in git("ls-tree", "-r", "--name-only", commit).decode().splitlines()
                   if name.endswith((".py", ".md")))
    batch, parts = git("cat-file", "--batch", given="".join(f"{commit}:{name}\n" for name in names).encode()), []
    at = 0
    for _ in names:           # each: "<sha> blob <size>\n", the content, "\n"
        header_end = batch.index(b"\n", at)
        size = int(batch[at:header_end].split()[2])
        parts.append(batch[header_end + 1:header_end + 1 + size])
        at = header_end + 2 + size
    return names, b"".join(parts)


def write_tokens(directory: Path, commit: str) -> dict:
    """train.bin and val.bin: the checkout's .py and .md files at ``commit``, one uint16 token per byte
    (real-looking text with a vocabulary of 256, nothing to download). Returns what was written."""
    import numpy as np
    names, text = committed_text(commit)
    tokens = np.frombuffer(text, dtype=np.uint8).astype(np.uint16)
    split = int(len(tokens) * VAL_SPLIT)
    directory.mkdir(parents=True, exist_ok=True)
    tokens[:split].tofile(directory / "train.bin")
    tokens[split:].tofile(directory / "val.bin")
    return {"source": f"the .py and .md files at {commit}, sorted by path, concatenated", "files": len(names),
            "train_tokens": split, "val_tokens": len(tokens) - split, "dtype": "uint16", "vocab_size": 256}


# -- the hosts: shaped links, pinned cores, a CPU quota ------------------------------------------

@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP held off while cleaning up, so that a second one cannot leave half
    of it undone (each step of the cleanup has its own time limit)."""
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = [signal.signal(s, signal.SIG_IGN) for s in signals]
    try:
        yield
    finally:
        for s, handler in zip(signals, previous):
            signal.signal(s, handler)


def raise_on_signals() -> None:
    """SIGTERM and SIGHUP end the bench as Ctrl-C does, through an exception, so every cleanup runs;
    Ctrl-C too where the shell started us with SIGINT ignored (a background job of a script)."""
    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, stop)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def netem_available() -> bool:
    """Whether this kernel has netem (tried on the loopback of a namespace made for the purpose)."""
    name = f"slprobe{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], capture_output=True, check=True)
    try:
        return subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                               "delay", "1ms"], capture_output=True).returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


class CpuQuota:
    """A CPU cgroup of our own whose quota is set per row: a host whose sshd is in it runs every worker
    it starts on at most that share of a core (cgroup v1 cpu.cfs_quota_us / cfs_period_us, v2 cpu.max)."""

    PERIOD_US = 100_000

    def __init__(self, name: str):
        v1 = Path("/sys/fs/cgroup/cpu")
        self.v1 = (v1 / "cpu.cfs_quota_us").exists()
        self.parent = v1 if self.v1 else Path("/sys/fs/cgroup")
        if not self.v1 and not (self.parent / "cgroup.controllers").exists():
            raise RuntimeError("no cgroup cpu controller found at /sys/fs/cgroup (v1 cpu/ or v2)")
        self.path = self.parent / name
        self.path.mkdir()
        if self.v1:
            (self.path / "cpu.cfs_period_us").write_text(str(self.PERIOD_US))
        elif not (self.path / "cpu.max").exists():
            self.close()
            raise RuntimeError("cgroup v2 without the cpu controller: "
                               "echo +cpu > /sys/fs/cgroup/cgroup.subtree_control")

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def limit(self, cores: float | None) -> None:
        """At most ``cores`` of a core from now on; None: no limit."""
        quota = None if cores is None else int(cores * self.PERIOD_US)
        if self.v1:
            (self.path / "cpu.cfs_quota_us").write_text(str(-1 if quota is None else quota))
        else:
            (self.path / "cpu.max").write_text(f"{'max' if quota is None else quota} {self.PERIOD_US}")

    def close(self, timeout: float = 10.0) -> None:
        """Remove the cgroup; processes still in it (they should be gone) move back to its parent."""
        deadline = time.monotonic() + timeout
        while self.path.exists():
            for pid in (self.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (self.parent / "cgroup.procs").write_text(pid)
            try:
                self.path.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


class Testbed:
    """N hosts (network namespaces with an sshd each) whose links are shaped to ``mbit`` each way,
    host i's sshd pinned to core i (mod the cores), the last host's sshd in a CpuQuota. Closing it
    kills every process on the hosts and removes the namespaces (their veths and qdiscs go with
    them), the bridge and the cgroup."""

    def __init__(self, directory: Path, count: int, mbit: float, delay_ms: float):
        directory.mkdir(parents=True, exist_ok=True)
        self.hosts = Hosts(directory, count)        # removes what it made if it fails
        self.quota: CpuQuota | None = None
        try:
            sshd = self.hosts.daemon_pids[:count]   # the sshd of each namespace, in host order
            for index, pid in enumerate(sshd):
                self.hosts.shape(index, mbit, delay_ms)
                subprocess.run(["taskset", "-a", "-p", "-c", str(index % os.cpu_count()), str(pid)],
                               capture_output=True, check=True)
            self.quota = CpuQuota(f"slow-link-{os.getpid()}")
            self.quota.add(sshd[-1])
        except BaseException:
            self.close()
            raise

    def sent_bytes(self) -> int:
        """Bytes the hosts have put on their links so far: what the bridge's ends of their veths
        received (worker to worker traffic counted once, on the sender's link)."""
        return sum(int(Path(f"/sys/class/net/{self.hosts.bridge}v{i}/statistics/rx_bytes").read_text())
                   for i in range(len(self.hosts.namespaces)))

    def close(self) -> None:
        with shielded():
            try:
                self.hosts.close()
            finally:
                if self.quota is not None:
                    self.quota.close()

    def __enter__(self) -> "Testbed":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# -- the rows -------------------------------------------------------------------------------------

def stop(process: subprocess.Popen) -> None:
    """End a Train.py we started and everything in its session: SIGTERM, then SIGKILL."""
    with shielded():
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def launch(command: list[str], log: Path, env: dict[str, str], timeout: float) -> int | None:
    """Run ``command`` from the checkout root in a session of its own (a Ctrl-C reaches us, and we stop
    it), its output to ``log``. Its exit status, or None if it ran past ``timeout`` seconds."""
    with log.open("w") as output:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            stop(process)


def common_flags(args: argparse.Namespace, data_dir: Path, hosts: Hosts, steps: int) -> list[str]:
    """What every row shares: one worker on each host over ssh, the model, the data, the optimizer,
    the per-worker batch and the run's length."""
    data_options = {"vocab_size": 256, "block_size": args.block_size, "val_windows": args.val_windows}
    return ["--launcher", "ssh", "--hosts", ",".join(f"{address}:1" for address in hosts.addresses),
            "--model", "gpt", "--model-options", json.dumps({"size": "tiny"}),
            "--dataset", "tokens", "--data-dir", str(data_dir), "--dataset-options", json.dumps(data_options),
            "--data-workers", "0", "--optimizer", "adamw", "--lr", str(args.lr), "--batch-size", str(args.batch_size),
            "--max-steps", str(steps), "--seed", "0", "--save", ""]


def run_row(bed: Testbed, variant: str, throttled: bool, flags: list[str], args: argparse.Namespace,
            samples: int) -> dict:
    """One Train.py run of ``variant`` on the testbed, measured: its row."""
    from harness.training.metrics import read_metrics
    log_dir = args.out / "runs" / (variant + ("-throttled" if throttled else ""))
    if log_dir.exists():       # metrics.jsonl is appended to: start from an empty folder
        subprocess.run(["rm", "-rf", str(log_dir)], check=True)
    log_dir.mkdir(parents=True)
    every = validation_interval(variant, args.validate_every, args.avg_every)
    command = train_command(*flags, *variant_flags(variant, args.avg_every, args.async_delay), "--validate-every", str(every),
                            "--log-dir", str(log_dir))
    row = {"variant": variant, "link_mbit": args.link_mbit, "throttled": throttled, "samples": samples,
           "validate_every": every, "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "command": shlex.join(["python", *command[1:]])}
    bed.quota.limit(args.throttle_cores if throttled else None)
    env = {**os.environ, "HARNESS_SSH": bed.hosts.ssh, "OMP_NUM_THREADS": "1"}
    before, launched = bed.sent_bytes(), time.time()
    status = launch(command, log_dir / "train.log", env, args.timeout)
    wall_s, sent = time.time() - launched, bed.sent_bytes() - before
    (log_dir / ".lock").unlink(missing_ok=True)     # Train.py's lock on its log dir: no result to keep
    if status != 0:
        error = f"timed out after {args.timeout} s" if status is None else refusal((log_dir / "train.log").read_text())
        return {**row, "error": error, "exit_status": status, "wall_s": wall_s}
    records = read_metrics(log_dir / "metrics.jsonl")
    curve = val_curve(records, launched)
    blocked, staleness = outer_sync_figures(records, wall_s)
    first = next((r["time"] - launched for r in records if r.get("event") == "first_step"), None)
    return {**row, "final_val_loss": curve[-1][1] if curve else None, "wall_s": wall_s, "time_to_target_s": None,
            "bytes_sent": sent, "blocked_frac": blocked, "max_staleness_seen": staleness, "startup_s": first,
            "val_curve": curve}


# -- the table ------------------------------------------------------------------------------------

def earlier_rows(path: Path, settings: dict) -> list[dict]:
    """The rows already in ``path`` if they were measured with ``settings``, else none (with a note)."""
    if not path.exists():
        return []
    earlier = json.loads(path.read_text())
    if earlier.get("settings") != settings:
        print(f"{path}: measured with other settings; its rows are replaced", flush=True)
        return []
    return earlier["rows"]


def save(path: Path, settings: dict, data: dict, rows: list[dict]) -> list[dict]:
    """Write the table with every row's time to the target; returns those rows."""
    target, rows = with_targets(rows)
    write_json(path, bench_record(settings=settings, data=data, target_val_loss=target, rows=rows))
    return rows


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help=f"folder for {RESULT} and each run's log (runs/VARIANT)")
    p.add_argument("--variants", default=",".join(VARIANT_NAMES),
                   help=f"rows with no host throttled, comma-separated (default all: {','.join(VARIANT_NAMES)})")
    p.add_argument("--throttled-variants", default="diloco,async",
                   help="rows with the last host held to --throttle-cores ('' for none; default diloco,async)")
    p.add_argument("--samples", type=int, default=6400, help="training samples in all, every row (default 6400)")
    p.add_argument("--batch-size", type=int, default=16, help="per worker (default 16)")
    p.add_argument("--block-size", type=int, default=64, help="tokens per sample (default 64)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW's learning rate, every row (default 1e-3)")
    p.add_argument("--avg-every", type=int, default=50, help="K, inner updates between syncs (default 50)")
    p.add_argument("--async-delay", type=int, default=5,
                   help="async: a worker trains on under its push until the answer is there, this many updates at "
                        "most (--outer-delay; default 5, 0: it waits at the push)")
    p.add_argument("--validate-every", type=int, default=10, help="updates between validations (default 10)")
    p.add_argument("--val-windows", type=int, default=256, help="validation samples (default 256)")
    p.add_argument("--data-commit", default="HEAD",
                   help="the commit whose .py and .md files make the token file (default HEAD; rows kept from an "
                        "earlier run need the same)")
    p.add_argument("--hosts", type=int, default=2, help="hosts, one worker each (default 2)")
    p.add_argument("--link-mbit", type=float, default=20.0, help="each host's link, each way (default 20)")
    p.add_argument("--delay-ms", type=float, default=0.0, help="netem delay each way, where the kernel has netem")
    p.add_argument("--throttle-cores", type=float, default=0.5, help="the throttled host's CPU (default 0.5)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before a row is stopped (default 900)")
    args = p.parse_args()
    for option in ("variants", "throttled_variants"):
        names = [name for name in getattr(args, option).split(",") if name]
        unknown = sorted(set(names) - set(VARIANT_NAMES))
        if unknown:
            p.error(f"--{option.replace('_', '-')}: unknown {', '.join(unknown)}; "
                    f"choose from {', '.join(VARIANT_NAMES)}")
        setattr(args, option, names)
    return args


def main() -> None:
    args = parse_args()
    reason = why_not()
    if reason:
        sys.exit(f"scripts.bench.slow_link: cannot make hosts as network namespaces here: {reason}")
    raise_on_signals()
    if args.delay_ms and not netem_available():
        print(f"this kernel has no netem: --delay-ms {args.delay_ms:g} is not applied", flush=True)
        args.delay_ms = 0.0
    steps = args.samples // (args.batch_size * args.hosts)
    samples = steps * args.batch_size * args.hosts
    rounds = math.lcm(args.avg_every, args.validate_every)
    if steps == 0 or steps % rounds:
        sys.exit(f"scripts.bench.slow_link: --samples {args.samples} makes {steps} updates of {args.hosts} x "
                 f"{args.batch_size} samples; make it a multiple of {rounds} updates (--avg-every and "
                 "--validate-every), so that every row ends on a sync and validates its last update")
    settings = {key: getattr(args, key) for key in ("hosts", "link_mbit", "delay_ms", "throttle_cores", "batch_size",
                                                    "block_size", "lr", "avg_every", "validate_every", "val_windows",
                                                    "async_delay")}
    commit = git("rev-parse", "--verify", f"{args.data_commit}^{{commit}}").decode().strip()
    settings.update(samples=samples, steps=steps, model="gpt tiny", optimizer="adamw", data_commit=commit)
    path = args.out / RESULT
    rows = earlier_rows(path, settings)
    plan = [(variant, False) for variant in args.variants] + [(variant, True) for variant in args.throttled_variants]
    with tempfile.TemporaryDirectory(prefix="slow-link-") as scratch:
        data = write_tokens(Path(scratch) / "data", commit)
        with Testbed(Path(scratch) / "hosts", args.hosts, args.link_mbit, args.delay_ms) as bed:
            flags = common_flags(args, Path(scratch) / "data", bed.hosts, steps)
            for variant, throttled in plan:
                print(f"{variant}{' (throttled)' if throttled else ''}: {steps} updates ...", flush=True)
                row = run_row(bed, variant, throttled, flags, args, samples)
                rows = save(path, settings, data, merge_rows(rows, [row]))
                print(format_table([row]).splitlines()[1], flush=True)
    print(format_table(rows))
    print(f"written: {path}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("scripts.bench.slow_link: interrupted; hosts, qdiscs, cgroup and runs removed", file=sys.stderr)
        sys.exit(130)
