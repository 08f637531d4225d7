"""GPU placement, decided without CUDA: contiguous blocks, clear errors, one GPU per child."""
import pytest

from harness import Parent
from harness.launch.placement import assign, resolve_gpus


@pytest.mark.parametrize("n, gpus, expected", [
    (4, [0, 1], [0, 0, 1, 1]),
    (6, [0, 1, 2], [0, 0, 1, 1, 2, 2]),
    (3, [0, 1], [0, 0, 1]),
    (2, [0, 1, 2, 3], [0, 1]),
    (2, [], [None, None]),
])
def test_children_fill_gpus_in_contiguous_blocks(n, gpus, expected):
    assert assign(n, gpus) == expected


def test_gpu_specs_resolve_against_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    assert resolve_gpus("all") == [0, 1, 2]
    assert resolve_gpus("0,2") == [0, 2]
    assert resolve_gpus([1]) == [1]
    assert resolve_gpus(None) == []
    with pytest.raises(ValueError, match="GPU 3 requested but 3 GPU"):
        resolve_gpus([3])
    with pytest.raises(ValueError, match="twice"):
        resolve_gpus([1, 1])
    with pytest.raises(ValueError, match="comma-separated"):
        resolve_gpus("first")


def test_missing_gpu_is_a_valueerror_that_counts_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with Parent() as parent:
        with pytest.raises(ValueError, match="0 GPU"):
            parent.fork(2, gpus=[0])
        with pytest.raises(ValueError, match="no GPU was found"):
            parent.fork(2, gpus="all")


def test_each_child_sees_only_its_gpu_as_cuda0(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7,9")
    with Parent() as parent:
        kids = parent.fork(4, gpus="all", env={"HARNESS_TEST": "yes"})
        kids.exec(lambda ctx: (__import__("os").environ["CUDA_VISIBLE_DEVICES"], ctx.gpu, str(ctx.device),
                               __import__("os").environ["HARNESS_TEST"]))
        seen = kids.wait()
    assert seen == [("7", "7", "cuda:0", "yes"), ("7", "7", "cuda:0", "yes"),
                    ("9", "9", "cuda:0", "yes"), ("9", "9", "cuda:0", "yes")]


def test_gpu_children_grow_allocator_segments_unless_the_user_configures_the_allocator(monkeypatch):
    from harness.control.spawn import environment
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)

    def child(gpu, remote=False, **run):
        return environment(0, 1, gpu, ("localhost", 0, 1), remote, run, 30.0)

    assert child(0)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert child(0, remote=True)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in child(None)                 # CPU children: nothing to configure
    assert child(0, PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:128")["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:False")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in child(0)
    assert child(0)["PYTORCH_ALLOC_CONF"] == "expandable_segments:False"
