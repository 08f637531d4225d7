"""Started by an engine: each one's recorded environment detected as it, the known false positives
not, one process per node enforced with the fix named, and a real torchrun start (on several nodes:
tests/test_agents.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from harness.launch.cluster import RETRY_EXIT, ClusterStart, check_start, detect
from harness.training.checks import check_cluster, resolve
from harness.training.config import ConfigError, TrainConfig
from harness.training.driver import resumes
from harness.training.metrics import read_metrics
from tests.helpers import ROOT, TRAIN_PY
from tests.helpers.engines import RECORDED
from tests.helpers.runs import finish, start_train, workers_of
from tests.helpers.slow_model import FLAGS as SLOW_FLAGS

@pytest.mark.parametrize("name", RECORDED)
def test_each_engine_is_detected_from_what_it_sets(name):
    env, expected = RECORDED[name]
    assert detect(env) == expected


@pytest.mark.parametrize("env, expected", [
    ({"KUBERNETES_PORT": "tcp://10.96.0.1:443", "KUBERNETES_SERVICE_HOST": "10.96.0.1"}, None),    # any pod
    ({"SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[0-1]"}, None),         # salloc's shell
    ({"SLURM_JOB_ID": "7", "SLURM_NNODES": "3", "SLURM_STEP_ID": "4294967294", "SLURM_PROCID": "0"}, None),  # sbatch's
    ({**RECORDED["slurm"][0], **RECORDED["torchrun"][0]}, "torchrun"),                              # torchrun in srun
    ({"MASTER_ADDR": "10.0.0.1", "WORLD_SIZE": "2", "RANK": "0"}, None),                           # a user's own
])
def test_what_is_not_an_engine_start_is_not_taken_for_one(env, expected):
    found = detect(env)
    assert (found.engine if found else None) == expected


def test_cluster_none_turns_detection_off_and_a_named_engine_must_be_there():
    assert detect(RECORDED["torchrun"][0], "none") is None
    assert detect(RECORDED["slurm"][0], "slurm").engine == "slurm"
    with pytest.raises(ValueError, match="--cluster slurm: this process was not started by slurm"):
        detect(RECORDED["torchrun"][0] | {"SLURM_STEP_ID": "0"}, "slurm")


def test_more_than_one_process_per_node_or_a_node_outside_the_job_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"torchrun started 8 processes.*torchrun --nproc-per-node 1"):
        check_start(ClusterStart("torchrun", 0, 1, 8))
    with pytest.raises(ValueError, match=r"this is node 3 of 2: a node rank must be 0..1"):
        check_start(ClusterStart("slurm", 3, 2))
    check_start(ClusterStart("kubeflow", 0, 1))
    check_start(ClusterStart("slurm", 1, 2))        # node 1 of 2: node 0's agent (tests/test_agents.py)


def test_a_process_mpi_bound_to_one_core_takes_every_cpu_and_says_so_and_other_engines_keep_theirs():
    """In a process of its own (affinity is per process): bound to CPU 0 as Open MPI binds by default."""
    assert (os.cpu_count() or 1) >= 2, "needs a machine with two CPUs to bind to one"
    code = ("import os\n"
            "from harness.launch.cluster import ClusterStart, unbind_from_mpi\n"
            "os.sched_setaffinity(0, {0})\n"
            "print(unbind_from_mpi(ClusterStart('torchrun', 0, 2)), sorted(os.sched_getaffinity(0)))\n"
            "print(unbind_from_mpi(ClusterStart('mpi', 0, 2)), sorted(os.sched_getaffinity(0)))\n"
            "print(unbind_from_mpi(ClusterStart('mpi', 0, 2)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    kept, taken, again = done.stdout.splitlines()
    assert kept == "None [0]", done.stderr
    every = list(range(os.cpu_count()))
    assert taken == (f"mpi bound this process to CPU 0; it runs this node's workers, so it takes all {len(every)} "
                     f"(mpirun --bind-to none says so itself) {every}")
    assert again == "None"


def test_a_restarted_job_resumes_from_the_checkpoint_it_was_writing(tmp_path, monkeypatch):
    save = tmp_path / "model.pt"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    for name, value in {**RECORDED["torchrun"][0], "TORCHELASTIC_RESTART_COUNT": "0"}.items():
        monkeypatch.setenv(name, value)
    assert resolve(TrainConfig(save=str(save)))[1].resume is None
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert resolve(TrainConfig(save=str(save)))[1].resume is None          # nothing saved yet: a fresh start
    save.write_bytes(b"")
    assert resolve(TrainConfig(save=str(save)))[1].resume == str(save)
    assert resumes(resolve(TrainConfig(save=str(save)))[1]) == f"; resuming {save}"
    save.unlink()
    assert "nothing to resume" in resumes(resolve(TrainConfig(save=str(save)))[1])   # said, not silently over
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="--nproc-per-node 1"):
        resolve(TrainConfig(save=str(save)))


def test_workers_dead_past_the_restart_budget_exit_with_a_status_the_engine_retries(tmp_path, monkeypatch):
    """Under an engine a lost run exits RETRY_EXIT (>= 128: a PyTorchJob's ExitCode policy restarts the job,
    which resumes), where a plain start exits 1 (tests/test_heal.py)."""
    for name, value in {**RECORDED["torchrun"][0], "TORCHELASTIC_RESTART_COUNT": "0"}.items():
        monkeypatch.setenv(name, value)
    process = start_train(tmp_path, *SLOW_FLAGS)
    os.kill(workers_of(process)[1], signal.SIGKILL)
    status, err, left, out = finish(process, tmp_path)

    assert status == RETRY_EXIT >= 128 and left == []
    assert "started by torchrun" in out and "training failed" in err and "SIGKILL" in err


def torchrun(tmp_path, per_node: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node",
         str(per_node), *TRAIN_PY, "--max-steps", "5", "--save", str(tmp_path / "model.pt"),
         "--log-dir", str(tmp_path / "logs")],
        cwd=ROOT, capture_output=True, text=True, timeout=240, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})


def test_train_py_under_torchrun_is_that_node_s_parent(tmp_path):
    done = torchrun(tmp_path, 1)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "started by torchrun: node 0 of 1, restart 0" in done.stdout
    records = read_metrics(tmp_path / "logs" / "metrics.jsonl")
    assert {"event": "cluster", "engine": "torchrun", "node_rank": 0, "nodes": 1, "restart_count": 0}.items() \
        <= next(r for r in records if r["event"] == "cluster").items()
    assert next(r for r in records if r["event"] == "done")["step"] == 5


def test_torchrun_with_two_processes_a_node_is_refused_naming_the_flag(tmp_path):
    done = torchrun(tmp_path, 2)
    assert done.returncode != 0
    assert "torchrun started 2 processes on this node" in done.stderr and "--nproc-per-node 1" in done.stderr


def test_a_restarted_job_that_began_by_resuming_another_checkpoint_goes_on_from_its_own(tmp_path):
    """``--resume old.pt --save new.pt`` restarted by its engine: new.pt holds where the job got to, old.pt only
    where it began (it went back to old.pt, and the updates since were trained again)."""
    (tmp_path / "new.pt").write_bytes(b"saved by the job")
    config = TrainConfig(resume=str(tmp_path / "old.pt"), save=str(tmp_path / "new.pt"), inherited=True)
    assert check_cluster(config, ClusterStart("torchrun", 0, 2, restart_count=1)).resume == str(tmp_path / "new.pt")
    assert check_cluster(config, ClusterStart("torchrun", 0, 2)).resume == str(tmp_path / "old.pt")
