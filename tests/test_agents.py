"""Node agents: Train.py started by an engine on several nodes, node 0 the parent and every other node
its agent (harness/launch/agents.py, agent.py). torchrun from the installed torch on two namespaced
hosts (tests/helpers/netns_hosts.py, tests/helpers/engines.py) must end bit-identical to --launcher ssh
on the same hosts, and heal a killed child without torchrun noticing; a run the engine restarts (torchrun,
a re-created pod, a Slurm requeue) resumes by itself and ends as if uninterrupted; the key every node
shares and the node count are checked with one-line errors."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

from harness.launch import agent, trust
from harness.launch.agents import Agents
from harness.launch.cluster import RETRY_EXIT, ClusterStart, rendezvous
from harness.launch.placement import on_this_node
from harness.resilience.checkpoint import load_checkpoint
from tests.helpers.ci import missing
from tests.helpers.engines import RECORDED, Job, PyTorchJob, Torchrun, key_file, mpirun
from tests.helpers.netns_hosts import Hosts
from tests.helpers.processes import harness_children
from tests.helpers import slow_model
from tests.helpers.slow_model import FLAGS as SLOW_FLAGS
from tests.helpers.training import flat_params, run_train, train_error

FLAGS = ["--max-steps", "30", "--batch-size", "16", "--seed", "4", "--cpu-workers", "1"]


def children_on(hosts: Hosts, index: int | None = None) -> list[int]:
    """The harness children running on host ``index`` (None: on any host)."""
    spaces = hosts.namespaces if index is None else hosts.namespaces[index:index + 1]
    return harness_children([pid for namespace in spaces for pid in hosts.processes(namespace)])


def records(directory) -> list[dict]:
    path = directory / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(job: Torchrun | PyTorchJob | Job, directory, event: str = "step") -> None:
    """Until node 0's run has logged an ``event`` record: an update, or "saved" a checkpoint (fails if the
    job ends first or after 120 s)."""
    deadline = time.monotonic() + 120
    while not any(r["event"] == event for r in records(directory)):
        assert time.monotonic() < deadline and job.running(), job.tail()
        time.sleep(0.1)


def slow_flags(workers: int, *more: str) -> list[str]:
    """The slow model's job (slow_model.FLAGS) on ``workers`` CPU workers (a node's, under an engine),
    saving every 20 updates, then ``more``: where its workers run and how often it saves do not change
    its arithmetic, so 2 local workers end as one on each of two nodes, stopped and resumed or not."""
    local = SLOW_FLAGS.index("--cpu-workers")
    return [*SLOW_FLAGS[:local], "--cpu-workers", str(workers), *SLOW_FLAGS[local + 2:], "--save-every-steps", "20",
            *more]


@pytest.fixture(scope="module")
def over_ssh(hosts, tmp_path_factory) -> torch.Tensor:
    """The parameters FLAGS end with on one worker on each of the first two hosts, started over ssh."""
    os.environ["HARNESS_SSH"] = hosts.ssh
    try:
        _, save = run_train(tmp_path_factory.mktemp("ssh"), *FLAGS[:-2], "--launcher", "ssh", "--hosts",
                            ",".join(f"{a}:1" for a in hosts.addresses[:2]), name="ssh")
    finally:
        del os.environ["HARNESS_SSH"]
    return flat_params(save)


@pytest.fixture(scope="module")
def two_node_straight(tmp_path_factory):
    """The checkpoint of the slow model's job (slow_model.FLAGS) uninterrupted on two local workers, which
    a two-node run of it, restarted or resumed, must equal."""
    return run_train(tmp_path_factory.mktemp("straight"), *slow_flags(2), name="straight")[1]


def test_torchrun_on_two_nodes_trains_as_ssh_does_on_the_same_hosts(hosts, over_ssh, tmp_path):
    """Encrypted (--encrypt) as well: the children's control plane as an ssh run's, the agents' link always."""
    job = Torchrun(hosts, tmp_path, *FLAGS, "--encrypt", "--save", str(tmp_path / "agents.pt"), "--log-dir",
                   str(tmp_path / "logs"))
    assert job.wait() == [0, 0], job.output(0) + job.output(1)
    assert "started by torchrun: node 0 of 2, restart 0" in job.output(0)
    assert "started by torchrun: node 1 of 2" in job.output(1)
    assert torch.equal(flat_params(tmp_path / "agents.pt"), over_ssh)
    assert [r["hosts"] for r in records(tmp_path) if r["event"] == "workers"] == [hosts.addresses[:2]]
    assert children_on(hosts) == []


def test_a_pytorchjob_s_worker_waits_for_the_master_s_name_then_its_port_and_trains_as_ssh_does(hosts, over_ssh,
                                                                                             tmp_path):
    """Kubernetes as the pods see it: the worker starts first, while the master's service name does not
    resolve yet, then resolves but nobody listens, until the master's pod starts."""
    job = PyTorchJob(hosts, tmp_path, *FLAGS, "--save", str(tmp_path / "job.pt"), "--log-dir", str(tmp_path / "logs"))
    try:
        job.start(1)
        job.await_output(1, "the name mnist-master-0 does not resolve yet")
        job.resolve(1)
        job.await_output(1, "mnist-master-0:23456 (%s) does not accept connections yet" % hosts.addresses[0])
        job.start(0)
        assert job.wait() == [0, 0], job.output(0) + job.output(1)
    finally:
        job.close()
    assert "started by kubeflow: node 0 of 2, restart 0" in job.output(0)
    assert torch.equal(flat_params(tmp_path / "job.pt"), over_ssh)
    assert children_on(hosts) == []


def test_a_child_killed_under_torchrun_is_healed_and_torchrun_never_restarts(hosts, two_node_straight, tmp_path):
    """The slow model's job (slow_model.FLAGS) on one worker on each of two nodes, node 1's killed: healed in
    place, it ends with the parameters of its uninterrupted run on two local workers, and the engine saw
    nothing (one start, restart count 0). Three nodes' agents are the Slurm tests' (tests/test_hosts.py)."""
    flags = slow_flags(1, "--max-restarts", "1", "--save", str(tmp_path / "model.pt"), "--log-dir",
                       str(tmp_path / "logs"))
    job = Torchrun(hosts, tmp_path, *flags, env={"OMP_NUM_THREADS": "1"})
    wait_for(job, tmp_path)
    os.kill(children_on(hosts, 1)[0], signal.SIGKILL)
    assert job.wait() == [0, 0], job.output(0)[-3000:]

    done = records(tmp_path)
    assert [(r["rank"], r["generation"]) for r in done if r["event"] == "recovered"] == [(1, 1)]
    assert [r["restart_count"] for r in done if r["event"] == "cluster"] == [0]
    assert torch.equal(flat_params(two_node_straight), flat_params(tmp_path / "model.pt"))
    assert children_on(hosts) == []


KEY = "0123456789abcdef" * 4


def parent_and_agent(parent_key: str, agent_key: str, agent_nodes: int = 2) -> tuple[Exception | None, object]:
    """Node 0's parent of a 2-node torchrun job and node 1's agent finding it on this machine's loopback,
    each with its key: (what the parent's wait for its agents raised, "connected" or what the agent's
    search raised)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = ClusterStart("torchrun", 0, 2)
    outcome: dict[str, BaseException | None] = {"parent": None}

    def parent() -> None:
        try:
            Agents(start, ("127.0.0.1", port), trust.preshared_key({"HARNESS_KEY": parent_key}), 1, 5.0, wait=3.0).close()
        except ValueError as error:
            outcome["parent"] = error
    thread = threading.Thread(target=parent)
    thread.start()
    hello = agent.hello_of(ClusterStart("torchrun", 1, agent_nodes), 1, 0)
    try:
        found = agent.find_parent("127.0.0.1", port, trust.preshared_key({"HARNESS_KEY": agent_key}), hello,
                                  time.monotonic() + 2.0)
        found.close()
        found = "connected"
    except (TimeoutError, ValueError) as error:
        found = error
    thread.join()
    return outcome["parent"], found


def test_nodes_with_the_same_key_connect_and_a_node_with_another_key_is_told_so():
    """Both "nodes" here are this machine: they connect, and the parent then refuses two nodes of one address."""
    parent, found = parent_and_agent(KEY, KEY)
    assert found == "connected" and "two nodes have the same address (127.0.0.1, 127.0.0.1)" in str(parent)
    parent, found = parent_and_agent(KEY, KEY[::-1])
    assert isinstance(found, TimeoutError) and "it has another key" in str(found) and "HARNESS_KEY_FILE" in str(found)
    assert "nodes 1 did not connect within 3 s" in str(parent) and "the same key" in str(parent)


def test_an_agent_whose_node_0_refuses_the_run_says_why_in_its_own_log(capsys):
    """Node 0 refuses two nodes of one address; node 1's log said only that it had connected, and exited 1."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    key = "k" * 64
    refused: list[ValueError] = []

    def node_0() -> None:
        with pytest.raises(ValueError) as error:
            Agents(ClusterStart("torchrun", 0, 2), ("127.0.0.1", port), trust.preshared_key({"HARNESS_KEY": key}), 1,
                   5.0, wait=20.0)
        refused.append(error.value)
    thread = threading.Thread(target=node_0)
    thread.start()
    status = agent.serve(ClusterStart("torchrun", 1, 2), 1, 0, 5.0, {"HARNESS_KEY": key, "HARNESS_PORT": str(port),
                                                                      "MASTER_ADDR": "127.0.0.1"}, find_timeout=20.0)
    thread.join()
    assert status == 1 and "two nodes have the same address" in str(refused[0])
    assert f"harness: node 0 refused the run: {refused[0]}" in capsys.readouterr().err


def test_a_node_of_a_job_with_another_node_count_is_refused_on_both_ends():
    parent, found = parent_and_agent(KEY, KEY, agent_nodes=3)
    assert isinstance(found, agent.Refused) and "started for a job of 3 nodes, but node 0 for one of 2" in str(found)
    assert str(parent) == str(found)


@pytest.mark.parametrize("env, message", [
    ({}, "neither HARNESS_KEY_FILE nor HARNESS_KEY is set"),
    ({"HARNESS_KEY": "short"}, "HARNESS_KEY holds 5 characters, fewer than 32"),
    ({"HARNESS_KEY_FILE": "/nonexistent/key"}, "HARNESS_KEY_FILE=/nonexistent/key: No such file or directory"),
])
def test_a_missing_or_weak_key_is_a_one_line_error_saying_how_to_make_one(env, message, monkeypatch, capsys):
    for name, value in {**RECORDED["torchrun"][0], "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "WORLD_SIZE": "2",
                        **env}.items():
        monkeypatch.setenv(name, value)
    for name in {"HARNESS_KEY", "HARNESS_KEY_FILE"} - set(env):
        monkeypatch.delenv(name, raising=False)
    line = train_error("--cpu-workers", "1", monkeypatch=monkeypatch, capsys=capsys)
    assert message in line and "secrets.token_hex(32)" in line and "export HARNESS_KEY_FILE=" in line


def test_a_key_file_others_can_read_is_warned_of_and_the_recipe_makes_one_they_cannot(tmp_path, capsys):
    """Whoever reads the key can sign what every node unpickles; the recipe the errors give makes it 0600."""
    loose = key_file(tmp_path)
    loose.chmod(0o644)
    from_file = trust.preshared_key({"HARNESS_KEY_FILE": str(loose)})
    assert from_file == trust.preshared_key({"HARNESS_KEY": loose.read_text()})
    warned = capsys.readouterr().err
    assert f"HARNESS_KEY_FILE={loose} can be read by other users (mode 0644)" in warned
    assert f"chmod 600 {loose}" in warned
    loose.chmod(0o600)
    trust.preshared_key({"HARNESS_KEY_FILE": str(loose)})
    assert capsys.readouterr().err == ""
    recipe = trust.HOW.split("make one with: ")[1].split("; and give")[0]
    (tmp_path / "new").mkdir()
    subprocess.run(["bash", "-c", recipe.replace("python", sys.executable)], cwd=tmp_path / "new", check=True)
    assert (tmp_path / "new" / "harness.key").stat().st_mode & 0o777 == 0o600


def test_node_0_that_cannot_listen_says_whether_the_address_or_the_port_is_wrong(monkeypatch, capsys):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = str(taken.getsockname()[1])
    said = {}
    for address in ("no-such-node.invalid", "10.255.255.1", "127.0.0.1"):
        for name, value in {**RECORDED["torchrun"][0], "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "2", "WORLD_SIZE": "2",
                            "MASTER_ADDR": address, "HARNESS_PORT": port, "HARNESS_KEY": "k" * 64}.items():
            monkeypatch.setenv(name, value)
        said[address] = train_error("--cpu-workers", "1", monkeypatch=monkeypatch, capsys=capsys)
    taken.close()
    assert "the name no-such-node.invalid does not resolve here" in said["no-such-node.invalid"]
    assert "10.255.255.1 (10.255.255.1) is not an address of this machine; the engine's master address (MASTER_ADDR) " \
           "must name node 0" in said["10.255.255.1"]
    assert said["127.0.0.1"].endswith("set HARNESS_PORT to a free port on every node")
    assert all("HARNESS_PORT" not in line for address, line in said.items() if address != "127.0.0.1")


def test_a_launcher_of_our_own_on_nodes_the_engine_started_is_refused(monkeypatch, capsys):
    for name, value in {**RECORDED["torchrun"][0], "GROUP_WORLD_SIZE": "2", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    line = train_error("--launcher", "ssh", "--hosts", "a:1,b:1", monkeypatch=monkeypatch, capsys=capsys)
    assert "torchrun started Train.py on each of its 2 nodes" in line and "drop --launcher, --hosts" in line


def test_the_rendezvous_is_the_engine_s_master_and_torchrun_s_port_is_left_to_it():
    torchrun = {**RECORDED["torchrun"][0], "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
    assert rendezvous(ClusterStart("torchrun", 1, 2), torchrun) == ("node0", 29501)
    # torchrun's store on an ephemeral port (its own pick): the port after it is folded below them, on every node
    ephemeral = {**torchrun, "MASTER_PORT": "41000"}
    assert rendezvous(ClusterStart("torchrun", 1, 2), ephemeral) == ("node0", 20000 + 41001 - 32768)
    assert rendezvous(ClusterStart("torchrun", 0, 2), {**ephemeral, "MASTER_PORT": "60999"})[1] == 20000 + 28232 % 12768
    assert rendezvous(ClusterStart("torchrun", 1, 2), {**torchrun, "HARNESS_PORT": "5000"}) == ("node0", 5000)
    pytorchjob = RECORDED["pytorchjob"][0]
    assert rendezvous(ClusterStart("kubeflow", 2, 3), pytorchjob) == ("job-master-0", 23456)
    assert rendezvous(ClusterStart("kubeflow", 1, 2), RECORDED["trainjob"][0]) == ("job-node-0-0.job", 29400)
    slurm = RECORDED["slurm"][0]
    assert rendezvous(ClusterStart("slurm", 1, 2), slurm) == ("node0", 29500)
    assert rendezvous(ClusterStart("sagemaker", 1, 2), RECORDED["sagemaker"][0]) == ("algo-1", 29500)
    assert rendezvous(ClusterStart("skypilot", 0, 3), RECORDED["skypilot"][0]) == ("10.0.0.1", 29500)
    with pytest.raises(ValueError, match="set MASTER_ADDR to its address on every node .e.g. mpirun -x MASTER_ADDR"):
        rendezvous(ClusterStart("mpi", 1, 2), RECORDED["openmpi"][0])


def test_a_worker_pod_that_dies_ends_the_run_with_the_status_the_operator_retries_and_a_survivor_s_checkpoint(
        hosts, two_node_straight, tmp_path):
    """A PyTorchJob's worker pod killed mid-run (its Train.py, the agent, SIGKILLed): after the heartbeat
    timeout node 0 reports the node lost; no worker can start there, so the survivor saves the update it
    holds, and node 0 exits RETRY_EXIT, which an ExitCode policy restarts. Resumed from that checkpoint, the
    run ends with the parameters of its uninterrupted run; nothing of it is left on either pod's host."""
    flags = slow_flags(1, "--model-options", '{"delay": 0.05}', "--heartbeat-timeout", "4", "--max-restarts", "2",
                       "--save", str(tmp_path / "job.pt"), "--log-dir", str(tmp_path / "logs"))
    job = PyTorchJob(hosts, tmp_path, *flags, env={"OMP_NUM_THREADS": "1"})     # the straight run's arithmetic
    try:
        job.resolve(1)
        job.start(0)
        job.start(1)
        wait_for(job, tmp_path)
        job.processes[1].kill()
        assert job.wait() == [RETRY_EXIT, -signal.SIGKILL], job.output(0)[-3000:]
    finally:
        job.close()
    assert f"node 1 ({hosts.addresses[1]}) is lost: no heartbeat from its agent" in job.output(0)
    assert children_on(hosts) == []
    saved = [r for r in records(tmp_path) if r["event"] == "saved"]
    assert saved[-1].get("salvaged") and saved[-1]["step"] < 60, saved
    assert load_checkpoint(str(tmp_path / "job.pt"))["step"] == saved[-1]["step"]
    _, resumed = run_train(tmp_path, *slow_flags(2, "--model-options", '{"delay": 0.05}', "--resume",
                                                 str(tmp_path / "job.pt")), name="resumed")
    assert torch.equal(flat_params(two_node_straight), flat_params(resumed))


def test_a_master_pod_re_created_after_its_death_finds_the_waiting_worker_and_resumes_the_run(hosts, two_node_straight,
                                                                                           tmp_path):
    """The master pod's Train.py SIGKILLed after a checkpoint, and the pod started again (an ExitCode policy
    re-creates it): the worker's agent, which lost the parent, waits for it, says the job restarted, and
    the run resumes from the checkpoint and ends with the parameters of its uninterrupted run."""
    flags = slow_flags(1, *slow_model.held(tmp_path / "gate", 30), "--save", str(tmp_path / "job.pt"), "--log-dir",
                       str(tmp_path / "logs"))
    job = PyTorchJob(hosts, tmp_path, *flags, env={"OMP_NUM_THREADS": "1"})
    try:
        job.resolve(1)
        job.start(0)
        job.start(1)
        wait_for(job, tmp_path, "saved")
        job.processes[0].kill()
        (tmp_path / "gate").touch()
        assert job.processes[0].wait() == -signal.SIGKILL
        job.await_output(1, "lost the parent; waiting up to 60 s for it to come back")
        job.start(0)
        assert job.wait() == [0, 0], job.output(0)[-3000:] + job.output(1)[-3000:]
    finally:
        job.close()
    assert "started by kubeflow: node 0 of 2, restart 1; resuming" in job.output(0)
    assert torch.equal(flat_params(two_node_straight), flat_params(tmp_path / "job.pt"))
    assert children_on(hosts) == []


def test_sigterm_to_node_0_stops_every_node_at_one_update_with_a_checkpoint(hosts, tmp_path):
    """As ``kill`` or a preemption notice does to the master pod: the workers on both nodes stop at one
    update and save, node 0 prints the command that continues, and the agent ends with node 0's status."""
    job = PyTorchJob(hosts, tmp_path, *SLOW_FLAGS[:SLOW_FLAGS.index("--cpu-workers")], "--cpu-workers", "1",
                     "--max-steps", "1000", "--save", str(tmp_path / "job.pt"), "--log-dir", str(tmp_path / "logs"))
    try:
        job.resolve(1)
        job.start(0)
        job.start(1)
        wait_for(job, tmp_path)
        job.processes[0].send_signal(signal.SIGTERM)
        assert job.wait() == [128 + signal.SIGTERM] * 2, job.output(0)[-3000:]
    finally:
        job.close()
    stopped = re.findall(r"Train\.py: SIGTERM: stopped at epoch \d+, update (\d+); saved \S+; continue with",
                         job.output(0))
    assert len(stopped) == 1, job.output(0)[-2000:]
    assert torch.load(tmp_path / "job.pt", weights_only=False)["step"] == int(stopped[0])
    assert children_on(hosts) == []


def test_a_child_killed_with_healing_off_restarts_the_group_on_the_same_nodes_from_the_checkpoint(hosts, two_node_straight,
                                                                                                 tmp_path):
    """``--heal off --max-restarts 1``: the parent starts a new group through the same agents, which resumes
    from the last checkpoint and ends with the uninterrupted run's parameters (torchrun sees nothing)."""
    flags = slow_flags(1, *slow_model.held(tmp_path / "gate", 30), "--max-restarts", "1", "--heal", "off", "--save",
                       str(tmp_path / "model.pt"), "--log-dir", str(tmp_path / "logs"))
    job = Torchrun(hosts, tmp_path, *flags, env={"OMP_NUM_THREADS": "1"})
    wait_for(job, tmp_path, "saved")
    os.kill(children_on(hosts, 1)[0], signal.SIGKILL)
    (tmp_path / "gate").touch()
    assert job.wait() == [0, 0], job.output(0)[-3000:]

    done = records(tmp_path)
    assert [r["rank"] for r in done if r["event"] == "restart"] == [1]
    assert [r["restart_count"] for r in done if r["event"] == "cluster"] == [0]
    assert torch.equal(flat_params(two_node_straight), flat_params(tmp_path / "model.pt"))
    assert children_on(hosts) == []


def test_an_sbatch_script_s_srun_step_one_task_a_node_trains_as_ssh_does(hosts, slurm, over_ssh, tmp_path):
    """``srun --ntasks-per-node=1 python Train.py`` in a batch script on two nodes of the namespaced Slurm
    cluster: node 0's task finds itself as the step's first node (its NodeAddr: the names node0, node1 do
    not resolve here), node 1's task is its agent."""
    job = Job(slurm, tmp_path, *FLAGS, "--save", str(tmp_path / "step.pt"), "--log-dir", str(tmp_path / "logs"),
              per_node=1, nodes=2, step=True, env={"HARNESS_KEY_FILE": str(key_file(tmp_path))})
    status, output = job.wait(180), job.text()
    assert status == 0, output
    assert "started by slurm: node 0 of 2, restart 0" in output and "started by slurm: node 1 of 2" in output
    assert torch.equal(flat_params(tmp_path / "step.pt"), over_ssh)
    assert children_on(hosts) == []


def test_an_sbatch_job_requeued_after_a_checkpoint_runs_again_resumes_by_itself_and_ends_as_if_uninterrupted(
        hosts, slurm, tmp_path):
    """``scontrol requeue`` of an sbatch job (``--requeue``) whose script's ``srun --ntasks-per-node=1`` runs
    Train.py on two nodes, once it has saved: Slurm ends the job (SIGTERM to both tasks: node 0 stops the
    run at one update and saves there) and runs the script again with SLURM_RESTART_COUNT=1, and the same
    command resumes from that checkpoint by itself and ends with the uninterrupted run's parameters."""
    # held at update 60 until Slurm's SIGTERM has come, whenever the requeue lands; a heartbeat timeout that
    # a machine busy starting two runs of Train.py at once does not reach (it changes no arithmetic)
    more = ["--max-steps", "120", "--heartbeat-timeout", "10"]
    _, straight = run_train(tmp_path, *slow_flags(2, *more), name="straight")
    flags = slow_flags(1, *more, *slow_model.held(tmp_path / "gate", 60), "--save", str(tmp_path / "job.pt"),
                       "--log-dir", str(tmp_path / "logs"))
    job = Job(slurm, tmp_path, *flags, per_node=1, nodes=2, step=True, requeue=True,
              env={"HARNESS_KEY_FILE": str(key_file(tmp_path)), "OMP_NUM_THREADS": "1"})
    wait_for(job, tmp_path, "saved")
    job.requeue()
    job.await_text("SIGTERM: finishing the current update")
    (tmp_path / "gate").touch()
    assert job.wait(240) == 0, job.tail()

    output, done = job.text(), records(tmp_path)
    stopped = [int(n) for n in re.findall(r"Train\.py: SIGTERM: stopped at epoch \d+, update (\d+); saved", output)]
    assert len(stopped) == 1 and 20 <= stopped[0] < 120, output[-3000:]
    assert f"started by slurm: node 0 of 2, restart 1; resuming {tmp_path / 'job.pt'}" in output
    assert "started by slurm: node 1 of 2, restart 1" in output
    assert [r["restart_count"] for r in done if r["event"] == "cluster"] == [0, 1]
    assert [r["step"] for r in done if r["event"] == "first_step"] == [1, stopped[0] + 1]
    assert torch.equal(flat_params(straight), flat_params(tmp_path / "job.pt"))
    assert children_on(hosts) == []


def test_mpirun_over_ssh_one_process_a_node_trains_as_ssh_does(hosts, over_ssh, tmp_path):
    if shutil.which("mpirun") is None:
        missing("mpirun is not installed (apt-get install openmpi-bin)")
    done = mpirun(hosts, tmp_path, *FLAGS, "--save", str(tmp_path / "mpi.pt"), "--log-dir", str(tmp_path / "logs"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "started by mpi: node 0 of 2, restart 0" in done.stdout and "started by mpi: node 1 of 2" in done.stdout
    # Open MPI binds each of the two processes to a core; each node's Train.py takes its node's CPUs back
    assert done.stdout.count("it runs this node's workers, so it takes all") == 2, done.stdout[-3000:]
    assert torch.equal(flat_params(tmp_path / "mpi.pt"), over_ssh)
    assert children_on(hosts) == []


def agent_process(hosts: Hosts, index: int) -> int:
    """The pid of Train.py (the node agent) that torchrun started on host ``index``."""
    for pid in hosts.processes(hosts.namespaces[index]):
        try:
            command = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except FileNotFoundError:
            continue
        if any(part.endswith(b"Train.py") for part in command) and b"torch.distributed.run" not in command:
            return pid
    raise AssertionError(f"no Train.py runs on host {index}")


def test_a_node_agent_killed_under_torchrun_restarts_the_job_which_resumes_where_it_was(hosts, two_node_straight,
                                                                                     tmp_path):
    """torchrun --max-restarts 1 on two nodes, node 1's agent SIGKILLed mid-run: torchrun restarts the job
    on both nodes, which resumes from the checkpoint and ends with the uninterrupted run's parameters. Its
    updates take 100 ms (the arithmetic is the same): at 30 ms, a loaded machine once let the run end before
    torchrun's restart reached node 0, which then found the rendezvous closed."""
    flags = slow_flags(1, "--model-options", '{"delay": 0.1}', "--max-restarts", "1", "--save",
                       str(tmp_path / "model.pt"), "--log-dir", str(tmp_path / "logs"))
    job = Torchrun(hosts, tmp_path, *flags, max_restarts=1, env={"OMP_NUM_THREADS": "1"})
    wait_for(job, tmp_path, "saved")
    os.kill(agent_process(hosts, 1), signal.SIGKILL)
    assert job.wait(240) == [0, 0], job.output(0)[-3000:]

    done = records(tmp_path)
    assert [r["restart_count"] for r in done if r["event"] == "cluster"][-1] == 1
    assert torch.equal(flat_params(two_node_straight), flat_params(tmp_path / "model.pt"))
    assert children_on(hosts) == []


def test_a_node_s_children_get_its_own_names_for_the_gpus_the_parent_numbered(monkeypatch):
    """The parent numbers a node's GPUs 0, 1, ...; a node whose CUDA_VISIBLE_DEVICES lists others (Slurm's
    --gres, a container) gives its children those."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert on_this_node({"CUDA_VISIBLE_DEVICES": "1", "HARNESS_GPU": "1", "X": "y"}) == \
        {"CUDA_VISIBLE_DEVICES": "6", "HARNESS_GPU": "6", "X": "y"}
    assert on_this_node({"CUDA_VISIBLE_DEVICES": "", "HARNESS_GPU": ""}) == {"CUDA_VISIBLE_DEVICES": "", "HARNESS_GPU": ""}

