import os

import numpy as np
import pytest
import torch
from torch import nn

from harness.resilience.checkpoint import (REQUIRED_KEYS, CheckpointError, load_checkpoint, save_checkpoint,
                                          write_atomically)
from harness.resilience.lock import NotWritable, check_writable
from harness.resilience.saved_config import read_config


def make_state(epoch: int = 3) -> dict:
    torch.manual_seed(epoch)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    config = {"lr": 0.1, "batch_size": 8, "nesterov": False, "milestones": [10, 20], "shape": (3, 2), "log": None}
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": epoch,
        "step": 10 * epoch,
        "config": config,
    }


def assert_same_state(loaded: dict, saved: dict) -> None:
    assert loaded.keys() == saved.keys()
    for name, tensor in saved["model"].items():
        assert torch.equal(loaded["model"][name], tensor)
    momentum = saved["optimizer"]["state"][0]["momentum_buffer"]
    assert torch.equal(loaded["optimizer"]["state"][0]["momentum_buffer"], momentum)
    assert loaded["optimizer"]["param_groups"] == saved["optimizer"]["param_groups"]
    assert (loaded["epoch"], loaded["step"], loaded["config"]) == (saved["epoch"], saved["step"], saved["config"])


def test_round_trip(tmp_path):
    state = make_state()
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, state)
    assert_same_state(load_checkpoint(path), state)
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def test_overwrite_replaces_previous_checkpoint(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, make_state(epoch=1))
    save_checkpoint(path, make_state(epoch=2))
    assert load_checkpoint(path)["epoch"] == 2


def test_failed_save_keeps_old_checkpoint_and_removes_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    old = make_state(epoch=1)
    save_checkpoint(path, old)
    real_save = torch.save

    def crash_mid_write(obj, file):
        real_save(obj, file)
        file.seek(file.tell() // 2)
        file.truncate()
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash_mid_write)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, make_state(epoch=2))
    assert os.listdir(tmp_path) == ["ckpt.pt"]
    assert_same_state(load_checkpoint(path), old)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.pt"
    with pytest.raises(CheckpointError, match="does not exist") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


def test_garbage_file(tmp_path):
    path = tmp_path / "garbage.pt"
    path.write_bytes(b"this is not a checkpoint\n" * 10)
    with pytest.raises(CheckpointError, match="not a readable checkpoint") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


def test_truncated_file(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, make_state())
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


def test_not_a_dict(tmp_path):
    path = tmp_path / "list.pt"
    torch.save([1, 2, 3], path)
    with pytest.raises(CheckpointError, match="list") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


class _Calls:
    """Unpickled, it would call os.system: a reader that resolved the pickle's globals would run it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_the_config_is_read_without_torch_and_without_calling_anything_in_the_file(tmp_path):
    state = make_state()
    state["config"]["name"] = "run"
    state["extra"] = {"bf16": torch.ones(3, dtype=torch.bfloat16), "rng": torch.get_rng_state(), "bytes": b"\x00\xff",
                      "calls": _Calls(tmp_path / "called")}
    path = tmp_path / "ckpt.pt"
    torch.save(state, path)
    assert read_config(path) == state["config"]
    assert not (tmp_path / "called").exists()
    save_checkpoint(tmp_path / "plain.pt", make_state())
    assert read_config(tmp_path / "plain.pt") == load_checkpoint(tmp_path / "plain.pt")["config"]


def test_a_config_that_cannot_be_read_names_the_file(tmp_path):
    garbage, truncated, listed = tmp_path / "garbage.pt", tmp_path / "truncated.pt", tmp_path / "list.pt"
    garbage.write_bytes(b"this is not a checkpoint\n" * 10)
    save_checkpoint(truncated, make_state())
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    torch.save([1, 2, 3], listed)
    for path, problem in ((garbage, "not a readable checkpoint"), (truncated, "not a readable checkpoint"),
                          (listed, "holds no run configuration"), (tmp_path / "nope.pt", "does not exist")):
        with pytest.raises(CheckpointError, match=problem) as info:
            read_config(path)
        assert str(path) in str(info.value)


def test_missing_keys_on_load(tmp_path):
    path = tmp_path / "partial.pt"
    state = make_state()
    del state["optimizer"], state["step"]
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=r"\['optimizer', 'step'\]") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


def test_save_rejects_missing_keys_and_unplain_config(tmp_path):
    path = tmp_path / "ckpt.pt"
    with pytest.raises(CheckpointError, match="epoch"):
        save_checkpoint(path, {key: 0 for key in REQUIRED_KEYS if key != "epoch"})
    state = make_state()
    state["config"]["lr"] = np.float64(0.1)
    with pytest.raises(CheckpointError, match=r"config\['lr'\] is a float64"):
        save_checkpoint(path, state)
    state["config"]["lr"] = 0.1
    state["config"]["milestones"] = [10, tmp_path]
    with pytest.raises(CheckpointError, match=r"config\['milestones'\]\[1\] is a PosixPath"):
        save_checkpoint(path, state)
    assert os.listdir(tmp_path) == []


def test_a_checkpoint_is_written_into_a_folder_still_to_make(tmp_path):
    """Rank 0 on another host than the parent's: only the parent's lock made the folder, on its own machine."""
    write_atomically(tmp_path / "on-this-host" / "model.pt", {"step": 1})
    assert torch.load(tmp_path / "on-this-host" / "model.pt") == {"step": 1}


def test_check_writable_accepts_a_folder_still_to_make_and_leaves_nothing_behind(tmp_path):
    (tmp_path / "runs").mkdir()
    path = tmp_path / "runs" / "a" / "b" / "ckpt.pt"
    check_writable(path)        # makes runs/a/b to probe it, then removes what it made
    assert os.listdir(tmp_path) == ["runs"] and os.listdir(tmp_path / "runs") == []


def test_check_writable_rejects_directory_under_a_file(tmp_path):
    # Root ignores permission bits, so make the directory impossible instead of read-only.
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory")
    path = blocker / "ckpt.pt"
    with pytest.raises(NotWritable, match="cannot be created or written") as info:
        check_writable(path)
    assert str(blocker) in str(info.value)


def test_check_writable_rejects_directory_as_path(tmp_path):
    with pytest.raises(NotWritable, match="is a directory"):
        check_writable(tmp_path)


def test_a_whole_model_or_a_bare_state_dict_is_named_as_such_not_as_a_corrupt_file(tmp_path):
    whole, bare = tmp_path / "whole.pt", tmp_path / "bare.pt"
    torch.save(torch.nn.Linear(2, 2), whole)
    torch.save(torch.nn.Linear(2, 2).state_dict(), bare)
    with pytest.raises(CheckpointError, match=r"holds pickled objects \(torch\.nn\.modules\.linear\.Linear: a whole "
                                              r"model saved with torch\.save\(model\)\?\)"):
        load_checkpoint(whole)
    with pytest.raises(CheckpointError, match=r"\(a model's bare state_dict\? give a checkpoint Train\.py wrote"):
        load_checkpoint(bare)
