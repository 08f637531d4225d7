"""Node agents: Train.py started by an engine on several nodes, node 0 the parent and every other node
its agent (harness/launch/agents.py, agent.py). torchrun from the installed torch on two namespaced
hosts (tests/helpers/netns_hosts.py, tests/helpers/engines.py) must end bit-identical to --launcher ssh
on the same hosts, and heal a killed child without torchrun noticing; the key every node shares and the
node count are checked with one-line errors."""
from __future__ import annotations

import os
import signal

import pytest
import torch

from harness.launch import agent, trust
from harness.launch.cluster import ClusterStart, rendezvous
from harness.training.metrics import read_metrics
from tests.helpers.ci import missing
from tests.helpers.engines import Torchrun
from tests.helpers.netns_hosts import Hosts, why_not
from tests.helpers.processes import harness_children
from tests.helpers.training import flat_params, run_train

FLAGS = ["--max-steps", "30", "--batch-size", "16", "--seed", "4", "--cpu-workers", "1"]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    reason = why_not()
    if reason:
        missing(f"cannot make hosts as network namespaces here: {reason}")
    made = Hosts(tmp_path_factory.mktemp("hosts"), count=2)
    yield made
    made.close()


def children_on(hosts: Hosts) -> list[int]:
    return harness_children([pid for namespace in hosts.namespaces for pid in hosts.processes(namespace)])


def test_torchrun_on_two_nodes_trains_as_ssh_does_on_the_same_hosts(hosts, tmp_path, monkeypatch):
    job = Torchrun(hosts, tmp_path, *FLAGS, "--save", str(tmp_path / "agents.pt"), "--log-dir", str(tmp_path / "logs"))
    assert job.wait() == [0, 0], job.output(0) + job.output(1)
    assert "started by torchrun: node 0 of 2, restart 0" in job.output(0)
    assert "started by torchrun: node 1 of 2" in job.output(1)
    monkeypatch.setenv("HARNESS_SSH", hosts.ssh)
    _, ssh = run_train(tmp_path, *FLAGS[:-2], "--launcher", "ssh", "--hosts", ",".join(f"{a}:1" for a in hosts.addresses),
                       name="ssh")
    assert torch.equal(flat_params(tmp_path / "agents.pt"), flat_params(ssh))
    records = read_metrics(tmp_path / "logs" / "metrics.jsonl")
    assert [r["hosts"] for r in records if r["event"] == "workers"] == [hosts.addresses]
    assert children_on(hosts) == []
