"""Several machines: children started over ssh on three "hosts" (network namespaces, each with its
own address and a real sshd; tests/netns_hosts.py), Train.py across them, a host cut off mid-run,
and the Slurm launcher: Train.py submitted with sbatch to a real Slurm cluster over the same three
namespaces (munge, slurmctld, one slurmd per namespace), its allocation parsing against recorded
environments, its srun steps' arguments through a stand-in srun."""
from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import time

import pytest
import torch

import Train
from harness.launch import make_launcher
from harness.training.checks import plan_workers
from harness import ChildFailed, Parent
from harness.collectives.hierarchical import HierarchicalCommunicator
from harness.launch.placement import assign_on_hosts
from harness.resilience.checkpoint import load_checkpoint
from harness.launch.launchers import Host, Slurm, Ssh, expand_counts, expand_nodelist, parse_hosts, read_hostfile, slurm_hosts
from harness.training.metrics import read_metrics
from tests.helpers import ROOT
from tests.helpers.engines import Job
from tests.helpers.netns_hosts import Hosts
from tests.helpers.processes import harness_children, wait_gone
from tests.helpers.runs import finish, interrupt, start_train
from tests.helpers.slow_model import FLAGS as SLOW_FLAGS
from tests.helpers.training import flat_params, run_train, train_error

COMMON = ["--max-steps", "30", "--batch-size", "16", "--seed", "4"]     # the runs compared with six local workers


@pytest.fixture(scope="module")
def six_local_workers(tmp_path_factory):
    """The checkpoint of Train.py on six local workers, which the runs across hosts must equal."""
    return run_train(tmp_path_factory.mktemp("local"), *COMMON, "--cpu-workers", "6", name="local")[1]


def where(ctx) -> tuple:
    return ctx.rank, ctx.host, ctx.address, os.readlink("/proc/self/ns/net"), os.environ.get("HARNESS_KEY")


def shared_on_each_host(ctx) -> tuple[list[int], float]:
    """The workers of each host as one group sharing a device (here host memory in place of CUDA IPC, gloo
    among the leaders): keyed by host, as GPU workers are by (host, GPU), so that GPU 0 of one host is not
    GPU 0 of another."""
    comm = HierarchicalCommunicator(ctx, ctx.exchange(ctx.unique_tag("keys"), (ctx.host, 0)), "gloo")
    ctx.own(comm)
    t = torch.full((1 << 16,), float(ctx.rank + 1))
    comm.all_reduce(t)
    return comm.group.members, t.max().item() - t.min().item() + t[0].item()


def all_reduce_forever(ctx) -> None:
    """All-reduce without end; says "reducing" to the parent once the first one is done."""
    comm = ctx.communicator()
    ones = torch.ones(1000)
    comm.all_reduce(ones, op="avg")
    ctx.send("reducing")
    while True:
        comm.all_reduce(ones, op="avg")


def children_on(hosts: Hosts, index: int | None = None) -> list[int]:
    """The harness children running on host ``index`` (None: on any host)."""
    spaces = hosts.namespaces if index is None else hosts.namespaces[index:index + 1]
    return harness_children([pid for namespace in spaces for pid in hosts.processes(namespace)])


def test_ssh_children_run_on_their_hosts_share_memory_only_there_and_a_host_cut_off_fails_naming_it(hosts, monkeypatch):
    monkeypatch.setenv("HARNESS_SSH", hosts.ssh)
    spaces = [f"net:[{os.stat(f'/run/netns/{ns}').st_ino}]" for ns in hosts.namespaces]
    with Parent(heartbeat_timeout=5.0) as parent:       # the functions' module imports torch: preloaded
        kids = parent.fork(6, launcher="ssh", hosts=",".join(f"{a}:2" for a in hosts.addresses), encrypt=True,
                           preload=("torch", "harness.collectives.gloo", __name__))
        assert kids.hosts == hosts.addresses
        kids.exec(where)
        found = kids.wait()
        assert [(r, h, a) for r, h, a, _, _ in found] == [(r, hosts.addresses[r // 2], hosts.addresses[r // 2])
                                                          for r in range(6)]
        assert [space for _, _, _, space, _ in found] == [spaces[r // 2] for r in range(6)]
        assert all(key is None for *_, key in found)      # the key was read and dropped from the environment
        kids.exec(shared_on_each_host)
        assert kids.wait() == [([r - r % 2, r - r % 2 + 1], 21.0) for r in range(6)]     # 1 + ... + 6

        kids.exec(all_reduce_forever)
        assert kids.receive() == ["reducing"] * 6
        hosts.link(1, up=False)
        cut = time.monotonic()
        try:
            with pytest.raises(ChildFailed) as failed:
                kids.wait()
            noticed = time.monotonic() - cut
        finally:
            hosts.link(1, up=True)
    assert failed.value.host == hosts.addresses[1] and failed.value.rank in (2, 3)
    assert f"on host {hosts.addresses[1]}" in str(failed.value) and "no heartbeat" in str(failed.value)
    print(f"host cut off: ChildFailed after {noticed:.1f} s (heartbeat timeout 5 s)")
    # The survivors' children ended with their ssh sessions; the cut-off host's, when the parent fell silent.
    wait_gone(children_on(hosts), 15.0)
    assert children_on(hosts) == []


def test_train_over_ssh_on_three_hosts_equals_six_local_workers(hosts, six_local_workers, tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_SSH", hosts.ssh)
    _, remote = run_train(tmp_path, *COMMON, "--launcher", "ssh", "--hosts", ",".join(f"{a}:2" for a in hosts.addresses),
                          name="ssh")
    local = flat_params(six_local_workers)
    assert (flat_params(remote) - local).abs().max() <= 1e-6 * local.abs().max()
    assert children_on(hosts) == []


def test_train_submitted_to_slurm_on_three_nodes_equals_six_local_workers(hosts, slurm, six_local_workers, tmp_path):
    job = Job(slurm, tmp_path, *COMMON, "--save", str(tmp_path / "slurm.pt"), "--log-dir", str(tmp_path / "logs"))
    assert job.wait(240) == 0, job.text()
    local = flat_params(six_local_workers)
    assert (flat_params(tmp_path / "slurm.pt") - local).abs().max() <= 1e-6 * local.abs().max()
    steps = [hosts.slurm_log(f"slurmd-{node}").count(f"launch task StepId={job.id}.") for node in hosts.nodes]
    assert steps == [1, 1, 1]         # one srun step a node: its session forks the node's two children
    assert children_on(hosts) == []


def test_a_worker_killed_under_slurm_fails_the_job_naming_its_node_and_leaves_nothing(hosts, slurm, tmp_path):
    job = Job(slurm, tmp_path, "--epochs", "1000", "--heartbeat-timeout", "5", "--log-dir", str(tmp_path / "logs"),
              per_node=1)
    deadline = time.monotonic() + 120
    while not (tmp_path / "logs" / "metrics.jsonl").exists() or not any(
            r["event"] == "step" for r in read_metrics(tmp_path / "logs" / "metrics.jsonl")):
        assert job.state()[0] != "COMPLETED" and time.monotonic() < deadline, job.text()
        time.sleep(0.2)
    os.kill(children_on(hosts, 1)[0], signal.SIGKILL)
    assert job.wait(60) == 1
    output = job.text()
    assert "child 1 on host node1 was killed by signal SIGKILL" in output, output       # as its session saw it
    wait_gone(children_on(hosts), 15.0)
    assert children_on(hosts) == []


def test_scancel_s_sigterm_to_every_process_of_a_job_stops_it_at_one_update_with_a_checkpoint(hosts, slurm, tmp_path):
    """``scancel --full --signal=TERM``, as a time limit's ``--signal`` does, reaches the parent and every node's
    session and workers at once: the sessions outlive it, the workers stop at one update and save."""
    save, logs = tmp_path / "model.pt", tmp_path / "logs"
    job = Job(slurm, tmp_path, "--epochs", "1000", "--log-dir", str(logs), "--save", str(save), per_node=1)
    deadline = time.monotonic() + 120
    while not (logs / "metrics.jsonl").exists() or not any(
            r["event"] == "step" for r in read_metrics(logs / "metrics.jsonl")):
        assert job.state()[0] != "COMPLETED" and time.monotonic() < deadline, job.text()
        time.sleep(0.2)
    subprocess.run(["scancel", "--full", "--signal=TERM", job.id], env=job.env, check=True)
    job.wait(60)
    done = [r for r in read_metrics(logs / "metrics.jsonl") if r["event"] == "done"]
    assert len(done) == 1 and done[0]["signal"] == signal.SIGTERM, job.text()
    assert load_checkpoint(save)["step"] == done[0]["step"]
    wait_gone(children_on(hosts), 15.0)
    assert children_on(hosts) == []


def test_a_worker_killed_on_its_host_is_healed_over_ssh_and_the_run_equals_the_uninterrupted_one(hosts, slow_straight,
                                                                                                tmp_path, monkeypatch):
    """The slow model's job (slow_model.FLAGS) on one worker on each of the three hosts: it must end with
    the parameters of its uninterrupted run on three local workers (the ``slow_straight`` fixture)."""
    monkeypatch.setenv("HARNESS_SSH", hosts.ssh)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")      # as the local run's workers have: the same arithmetic
    local = SLOW_FLAGS.index("--cpu-workers")
    flags = [*SLOW_FLAGS[:local], *SLOW_FLAGS[local + 2:], "--save-every-steps", "20", "--heartbeat-timeout", "5"]
    remote = ["--launcher", "ssh", "--hosts", ",".join(f"{a}:1" for a in hosts.addresses), "--max-restarts", "1"]
    process = start_train(tmp_path, *flags, *remote)
    victim = children_on(hosts, 1)
    os.kill(victim[0], signal.SIGKILL)
    status, err, left, _ = finish(process, tmp_path)

    assert status == 0, err
    heals = [r for r in read_metrics(tmp_path / "logs" / "metrics.jsonl") if r["event"] == "recovered"]
    assert [(r["rank"], r["generation"]) for r in heals] == [(1, 1)] and left == []
    assert "was killed by signal SIGKILL" in heals[0]["cause"], heals[0]       # its host's session saw how it died
    assert torch.equal(flat_params(slow_straight), flat_params(tmp_path / "model.pt"))
    assert children_on(hosts) == []


def test_sigterm_stops_a_run_on_three_hosts_at_one_update_with_a_checkpoint(hosts, tmp_path, monkeypatch):
    """The signal reaches the remote workers as a message (their hosts' sessions run in process sessions
    of their own, out of reach of the terminal's Ctrl-C): they stop at one update and save, as on one machine."""
    monkeypatch.setenv("HARNESS_SSH", hosts.ssh)
    interrupt(tmp_path, signal.SIGTERM, True, ["--launcher", "ssh", "--hosts", ",".join(f"{a}:1" for a in hosts.addresses),
                                               "--epochs", "1000"])
    assert children_on(hosts) == []


def test_hosts_and_hostfiles_are_parsed(tmp_path):
    assert parse_hosts("node1:8, node2:4,node3") == [Host("node1", 8), Host("node2", 4), Host("node3", 1)]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the cluster\nnode1 slots=8\nnode2:2   # half\n\nnode3\n")
    assert read_hostfile(str(hostfile)) == [Host("node1", 8), Host("node2", 2), Host("node3", 1)]
    for bad in ("node1:0", "node1:x", ":4", ""):
        with pytest.raises(ValueError, match="--hosts"):
            parse_hosts(bad)
    assert Ssh([Host("a", 2), Host("b", 3)]).place(4) == [("a", 0, 2), ("a", 1, 2), ("b", 0, 2), ("b", 1, 2)]
    with pytest.raises(ValueError, match="6 children do not fit the hosts' 5 slots"):
        Ssh([Host("a", 2), Host("b", 3)]).place(6)


def test_workers_per_gpu_on_other_hosts_share_each_hosts_gpus_and_restart_rather_than_heal():
    args = Train.parse_args(["--launcher", "ssh", "--hosts", "a:4,b:4,c:2", "--gpus", "all", "--workers-per-gpu", "2",
                             "--max-restarts", "2"])
    gpus, planned = plan_workers(args)
    assert (gpus, planned.workers) == ([0, 1], 10)
    places = Ssh(make_launcher("ssh", args.hosts).hosts).place(planned.workers)
    assert assign_on_hosts([(index, n) for _, index, n in places], gpus) == [0, 0, 1, 1, 0, 0, 1, 1, 0, 1]
    assert planned.heal_in_place is False        # workers sharing a GPU restart from the checkpoint
    # --gpus 0,1 on hosts of 4 slots shares them two to a GPU without the flag, and is treated alike
    implied = Train.parse_args(["--launcher", "ssh", "--hosts", "a:4", "--gpus", "0,1", "--max-restarts", "2"])
    gpus, planned = plan_workers(implied)
    assert (gpus, planned.workers, planned.workers_per_gpu) == ([0, 1], 4, 2)
    assert planned.heal_in_place is False


def test_slurm_allocations_are_read_from_their_environment():
    # As sbatch sets them (--nodes=3 --ntasks-per-node=8; a heterogeneous allocation; one node)
    assert expand_nodelist("gpu-st-p4d-[1-2],cpu07") == ["gpu-st-p4d-1", "gpu-st-p4d-2", "cpu07"]
    assert expand_nodelist("node[01-03,10]") == ["node01", "node02", "node03", "node10"]
    assert expand_nodelist("rack[1-2]-n[7-8]") == ["rack1-n7", "rack1-n8", "rack2-n7", "rack2-n8"]
    assert expand_counts("8(x2),2") == [8, 8, 2] and expand_counts("4") == [4]
    assert slurm_hosts({"SLURM_JOB_NODELIST": "node[01-03]", "SLURM_TASKS_PER_NODE": "8(x3)"}) == \
        [Host("node01", 8), Host("node02", 8), Host("node03", 8)]
    with pytest.raises(ValueError, match="has 2 nodes but SLURM_TASKS_PER_NODE=8"):
        slurm_hosts({"SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "8"})
    with pytest.raises(ValueError, match="run inside a Slurm allocation"):
        slurm_hosts({})


@pytest.mark.parametrize("per_node", [1, 2])
def test_train_started_by_an_srun_step_is_its_node_s_parent_one_task_a_node(hosts, slurm, tmp_path, per_node):
    """Slurm starts Train.py itself (an sbatch script's srun): one task on one node trains that node's
    CPU workers and says who started it; two tasks on the node are refused, naming srun's flag."""
    job = Job(slurm, tmp_path, "--max-steps", "10", "--save", str(tmp_path / "step.pt"), "--log-dir",
              str(tmp_path / "logs"), per_node=per_node, nodes=1, step=True)
    status, output = job.wait(240), job.text()
    if per_node == 1:
        assert status == 0, output
        assert "started by slurm: node 0 of 1, restart 0" in output
        assert torch.load(tmp_path / "step.pt", weights_only=False)["step"] == 10
    else:
        assert status != 0 and "slurm started 2 processes on this node" in output and "--ntasks-per-node 1" in output


def test_slurm_starts_one_srun_step_a_node_with_the_cpus_of_its_workers(tmp_path, monkeypatch):
    """A stand-in srun records its arguments and runs the command here, as srun would on the node."""
    record = tmp_path / "srun.log"
    srun = tmp_path / "bin" / "srun"
    srun.parent.mkdir()
    srun.write_text(f"#!/bin/sh\necho \"$@\" >> {record}\nwhile [ \"${{1#--}}\" != \"$1\" ]; do shift; done\n"
                    "exec \"$@\"\n")
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{srun.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    launcher = Slurm({"SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "2,1"})
    with Parent() as parent:
        kids = parent.fork(3, launcher=launcher, address="127.0.0.1")
        kids.exec(where)
        assert [(r, h) for r, h, *_ in kids.wait()] == [(0, "node1"), (1, "node1"), (2, "node2")]
    steps = record.read_text().splitlines()
    assert len(steps) == 2 and all("--nodes=1 --ntasks=1" in s and "--overlap" in s for s in steps)
    assert sorted((s.split("--nodelist=")[1].split()[0], s.split("--cpus-per-task=")[1].split()[0]) for s in steps) \
        == [("node1", "6"), ("node2", "3")]                          # 2 and 1 workers of 3 CPUs each
    assert not any(parent._key.hex() in s for s in steps)           # the key is in the requests on stdin, not argv
    assert all(re.search(rf"PYTHONPATH={re.escape(str(ROOT))}[:\s]", s) for s in steps)    # the checkout itself


@pytest.mark.parametrize("flags, message", [
    (["--launcher", "ssh"], "--launcher ssh needs the hosts"),
    (["--launcher", "ssh", "--hosts", "node1:0"], "'node1:0' is not host:slots"),
    (["--hosts", "node1:2"], "--hosts and --hostfile go with --launcher ssh, not local"),
    (["--encrypt"], "--control-address and --encrypt are for workers on other hosts"),
    (["--launcher", "slurm"], "SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE are not set"),
    (["--launcher", "ssh", "--hostfile", "/nonexistent/hosts"], "--hostfile /nonexistent/hosts: No such file"),
    (["--launcher", "ssh", "--hosts", "node1:2", "--mps"], "--mps works on one machine only so far"),
    (["--launcher", "ssh", "--hosts", "node1:8", "--gpus", "0,1", "--workers-per-gpu", "2"],
     "a host with 8 slots would put 4 workers on a GPU"),
])
def test_bad_launcher_flags_are_one_line_errors(flags, message, tmp_path, monkeypatch, capsys):
    for name in ("SLURM_JOB_NODELIST", "SLURM_TASKS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    assert message in train_error(*flags, "--log-dir", str(tmp_path), monkeypatch=monkeypatch, capsys=capsys)
