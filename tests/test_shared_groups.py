"""Several workers sharing one device: the hierarchical protocol (comm/hierarchical.py) on CPU
children, with host shared memory in place of CUDA IPC and gloo among the leaders. The GPU tests
run the same cases on CUDA IPC and NCCL."""
import glob
import os
import time

import pytest
import torch

from harness import ChildError, Parent
from harness.collectives.hierarchical import HierarchicalCommunicator, local_groups
from tests.helpers.collectives import assert_dead_peer_raises_childfailed, check_matrix, make_inputs, run_matrix
from tests.helpers.training import flat_params, run_train


def grouped(keys):
    """A communicator factory for the children: rank r belongs to group keys[r]."""
    def make(ctx):
        comm = HierarchicalCommunicator(ctx, keys, "gloo")
        ctx.own(comm)
        return comm
    return make


@pytest.fixture(scope="module")
def four():
    with Parent() as parent:
        yield parent.fork(4)


def test_local_groups_keep_rank_order_and_first_appearance():
    assert local_groups(["b", "b", "a", "a"]) == [[0, 1], [2, 3]]
    assert local_groups([0, 1, 0]) == [[0, 2], [1]]


@pytest.mark.parametrize("keys", [[0, 0, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0], [0, 1, 2, 3]],
                         ids=["2+2", "3+1", "one-group", "no-sharing"])
def test_every_op_dtype_and_placement_matches_float64_reference(four, keys):
    inputs = make_inputs(4)
    four.exec(run_matrix, inputs, grouped(keys))
    results = four.wait()
    assert check_matrix(inputs, results) == 4 * len(results[0]) > 0


def test_slots_grow_for_a_large_buffer_and_results_stay_exact(four):
    def work(ctx):
        comm = grouped([0, 0, 1, 1])(ctx)
        sizes = [10, 3 << 20, 100, 5 << 20]          # 12 MB then 20 MB: two growths past the first 1 MB slot
        sums = []
        for n in sizes:
            t = torch.full((n,), float(ctx.rank + 1))
            comm.all_reduce(t)
            sums.append((t.min().item(), t.max().item()))
        return comm.group.capacity, sums
    four.exec(work)
    for capacity, sums in four.wait():
        assert capacity >= (5 << 20) * 4
        assert sums == [(10.0, 10.0)] * 4


def test_leader_and_member_report_the_group(four):
    def work(ctx):
        comm = grouped([0, 0, 1, 1])(ctx)
        return comm.group.members, comm.group.index, comm.leaders is not None, comm.size
    four.exec(work)
    assert four.wait() == [
        ([0, 1], 0, True, 4), ([0, 1], 1, False, 4), ([2, 3], 0, True, 4), ([2, 3], 1, False, 4)]


def _raise_in_group(ctx, when):
    comm = grouped([0, 0, 1, 1])(ctx)
    t = torch.ones(4)
    comm.all_reduce(t)
    if ctx.rank == 1 and when == "mid":
        raise ValueError("boom on rank 1")
    comm.all_reduce(t)
    if ctx.rank == 1:
        raise ValueError("boom on rank 1")
    return t.sum().item()


@pytest.mark.parametrize("when", ["mid", "after"], ids=["between-collectives", "after-the-last"])
def test_a_rank_that_raises_releases_its_group_and_the_children_serve_on(four, when):
    four.exec(_raise_in_group, when)
    with pytest.raises(ChildError, match="boom on rank 1"):
        four.wait()
    inputs = make_inputs(4)
    four.exec(run_matrix, inputs, grouped([0, 0, 1, 1]))      # the same children, a fresh group
    assert check_matrix(inputs, four.wait()) > 0


def test_no_shared_memory_file_outlives_a_group_that_failed_to_form(four):
    def work(ctx):
        if ctx.rank == 1:
            raise ValueError("rank 1 never joins its group")
        grouped([0, 0, 1, 1])(ctx)
    pattern = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp", "harness-*")
    before = set(glob.glob(pattern))
    four.exec(work)
    with pytest.raises(ChildError, match="never joins"):
        four.wait()
    deadline = time.monotonic() + 10                # the others leave their exchanges on the abort
    while set(glob.glob(pattern)) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(glob.glob(pattern)) - before == set()


@pytest.mark.parametrize("victim", [1, 2], ids=["member", "leader"])
def test_a_dying_worker_of_a_shared_group_raises_childfailed(victim):
    assert_dead_peer_raises_childfailed(4, None, victim, grouped([0, 0, 1, 1]))


def _train_in_groups(ctx, config, keys):
    from harness.training.loop import train_worker
    ctx.communicator = lambda backend=None, **options: grouped(keys)(ctx)
    return train_worker(ctx, config)


def _config(tmp_path, name, *flags):
    import Train
    from harness.training.checks import check
    args = Train.parse_args(["--epochs", "1", "--seed", "3", "--batch-size", "8", "--save", str(tmp_path / f"{name}.pt"),
                             "--log-dir", str(tmp_path / name), *flags])
    return check(args)[1]


@pytest.mark.parametrize("mode", ["grad", "param"])
def test_training_in_shared_groups_equals_four_separate_workers(four, tmp_path, mode):
    flags = ["--mode", mode, *(["--avg-every", "3"] if mode == "param" else []), "--cpu-workers", "4"]
    four.exec(_train_in_groups, _config(tmp_path, "grouped", *flags), [0, 0, 1, 1])
    grouped_results = four.wait()
    separate_results, separate = run_train(tmp_path, "--epochs", "1", "--seed", "3", "--batch-size", "8", *flags,
                                           name="separate")
    assert len({r["checksum"] for r in grouped_results}) == 1
    assert grouped_results[0]["step"] == separate_results[0]["step"] > 0
    a, b = flat_params(tmp_path / "grouped.pt"), flat_params(separate)
    assert (a - b).norm() / b.norm() <= 1e-5
