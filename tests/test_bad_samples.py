"""Bad samples and image folders without val/, on CPU workers: a corrupt file is skipped, replaced by
the next file that loads and named in the log, the same whichever loader process met it and after a
resume; past --max-bad-samples the run saves and stops with the list; the parent's check skips a
corrupt first file; an image folder with only train/ is validated and tested on a part carved from it."""
from __future__ import annotations

import collections
import re
import shutil
from pathlib import Path

import pytest
import torch

import Train
from harness.checkout.datasets import open_data
from harness.checkout.datasets.sharding import shard_indices
from harness.data.bad_samples import EXCHANGE_EVERY
from harness.data.pipeline import Seeded
from harness.resilience.checkpoint import load_checkpoint
from harness.training import ConfigError
from harness.training.checks import check
from harness.training.metrics import read_metrics
from tests.helpers.training import flat_params, run_test_py, run_train, stop_and_resume

CROP = {"crop": 16, "resize": 20}
# Not next to one another in file order, so each is met only in its own place (a replacement is the next file).
CORRUPT = {"c0/000.jpg": b"not a jpeg at all", "c1/003.jpg": b"\xff\xd8\xff\xe0 truncated", "c2/005.jpg": b""}


def damaged(images: Path, tmp_path: Path, corrupt: dict[str, bytes] = CORRUPT, val: bool = True) -> Path:
    """A copy of the image folder with the ``corrupt`` files of train/ overwritten (and val/ removed)."""
    root = shutil.copytree(images, tmp_path / "damaged")
    for name, data in corrupt.items():
        (root / "train" / name).write_bytes(data)
    if not val:
        shutil.rmtree(root / "val")
    return root


def flags(root: Path, *more: str) -> list[str]:
    """24 training images, 2 CPU workers x batch 2: 6 updates an epoch."""
    return ["--dataset", "imagefolder", "--data-dir", str(root), "--dataset-options", '{"crop": 16, "resize": 20}',
            "--batch-size", "2", "--cpu-workers", "2", "--data-workers", "1", *more]


def bad_records(log: Path) -> list[dict]:
    return [r for r in read_metrics(log / "metrics.jsonl") if r["event"] == "bad_sample"]


def occurrences(records: list[dict]) -> list[tuple]:
    return sorted((r["update"], r["path"], r["rank"], r["error"]) for r in records)


def test_a_bad_sample_is_replaced_by_the_next_that_loads_drawn_under_its_seed(images, tmp_path):
    root = damaged(images, tmp_path)
    train = Seeded(open_data("imagefolder", str(root), **CROP).train)
    (x, y), failures = train[(0, 77)]
    (expected, label), none = train[(1, 77)]
    assert torch.equal(x, expected) and y == label and none == []
    assert failures == [{"path": str(root / "train" / "c0" / "000.jpg"),
                         "error": "cannot be decoded (not an image format Pillow knows)"}]


def test_corrupt_files_are_skipped_named_once_per_occurrence_and_a_resume_is_exact(images, tmp_path):
    root = damaged(images, tmp_path)
    straight, resumed, results, stopped = stop_and_resume(tmp_path, flags(root), 4, 12)
    assert {r["step"] for r in results} == {12} and stopped["step"] == 4
    assert (straight - resumed).norm() <= 1e-6 * resumed.norm()
    # Each corrupt file is met once an epoch, by the rank whose shard holds it, and logged by rank 0.
    train = open_data("imagefolder", str(root), **CROP).train
    index = {str(train.path(i)): i for i in range(len(train))}
    expected = collections.Counter()
    for epoch in range(2):
        for rank in range(2):
            mine = set(shard_indices(len(train), rank, 2, epoch, seed=0).tolist())
            expected.update((str(root / "train" / name), rank) for name in CORRUPT if index[str(root / "train" / name)] in mine)
    assert {rank for _, rank in expected} == {0, 1}            # both ranks meet some (seed 0's order)
    logged = bad_records(tmp_path / "straight")
    assert collections.Counter((r["path"], r["rank"]) for r in logged) == expected
    assert all(r["split"] == "train" and r["error"].startswith("cannot be decoded (") for r in logged)
    # The stopped run and its resume logged between them exactly what the straight run did, at the same updates.
    assert occurrences(bad_records(tmp_path / "stopped") + bad_records(tmp_path / "resumed")) == occurrences(logged)


def test_the_replacement_does_not_depend_on_the_loader_processes(images, tmp_path):
    root = damaged(images, tmp_path)
    _, in_process = run_train(tmp_path, *flags(root, "--data-workers", "0", "--max-steps", "6"), name="none")
    _, two = run_train(tmp_path, *flags(root, "--data-workers", "2", "--max-steps", "6"), name="two")
    assert torch.equal(flat_params(in_process), flat_params(two))
    assert len(bad_records(tmp_path / "two")) == len(CORRUPT)


def test_past_max_bad_samples_the_run_saves_and_stops_with_the_list(images, tmp_path, monkeypatch, capsys):
    root = damaged(images, tmp_path)
    save = tmp_path / "m.pt"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    status = Train.main(flags(root, "--max-bad-samples", "2", "--epochs", "5", "--save", str(save),       # in this process
                              "--log-dir", str(tmp_path / "log")))
    err = capsys.readouterr().err
    assert status == 1, err
    stopped = [line for line in err.splitlines() if line.startswith("Train.py: ")]
    assert len(stopped) == 1 and stopped[0].startswith("Train.py: training failed: 3 bad samples, more than "
                                                        "--max-bad-samples 2"), err
    assert "Traceback" not in err, err          # the data's fault, named with the fix: its line alone
    for name in CORRUPT:
        assert f"{root / 'train' / name}: cannot be decoded" in err
    assert f"continue with --resume {save}" in err
    records = bad_records(tmp_path / "log")
    third = sorted(min(r["update"] for r in records if r["path"] == path) for path in {r["path"] for r in records})[2]
    stop = max(r["step"] for r in records)                 # the update at which the ranks found out
    assert third <= stop < third + EXCHANGE_EVERY
    assert load_checkpoint(save)["step"] == stop < 30      # saved at the stop, not at the run's end


def test_a_corrupt_first_file_is_skipped_by_the_check_unless_no_bad_sample_may_be(images, tmp_path, capsys):
    root = damaged(images, tmp_path, {"c0/000.jpg": b"not a jpeg"})
    (root / "val" / "c0" / "000.jpg").write_bytes(b"\xff\xd8\xff truncated")
    base = ["--dataset", "imagefolder", "--data-dir", str(root), "--batch-size", "2", "--save", str(tmp_path / "m.pt"),
            "--log-dir", str(tmp_path)]
    assert check(Train.parse_args(base))[1].samples == 24
    said = capsys.readouterr().err
    assert f"{root / 'train' / 'c0' / '000.jpg'}: cannot be decoded" in said and f"{root / 'val' / 'c0' / '000.jpg'}" in said
    first = re.escape(str(root / "train" / "c0" / "000.jpg"))
    with pytest.raises(ConfigError, match=rf"sample 0 does not load: {first}: cannot be decoded .*\(--max-bad-samples 0\)") \
            as error:
        check(Train.parse_args([*base, "--max-bad-samples", "0"]))
    assert "\n" not in str(error.value)


def test_an_image_folder_with_only_train_is_validated_and_tested_on_a_carved_part(images, tmp_path, capsys,
                                                                                 monkeypatch):
    root = damaged(images, tmp_path, {}, val=False)
    carved = [open_data("imagefolder", str(root), seed=seed, val_fraction=0.25, **CROP) for seed in (0, 0, 1)]
    paths = [({str(d.train.path(i)) for i in range(len(d.train))}, {str(d.val.path(i)) for i in range(len(d.val))})
             for d in carved]
    assert paths[0] == paths[1] != paths[2]                     # the same part for the same seed
    train, val = paths[0]
    assert len(val) == 6 and not train & val and len(train | val) == 24
    assert not carved[0].val.train and carved[0].train.train    # validation is not augmented
    _, save = run_train(tmp_path, "--dataset", "imagefolder", "--data-dir", str(root), "--dataset-options",
                        '{"crop": 16, "resize": 20}', "--val-fraction", "0.25", "--batch-size", "3", "--epochs", "1")
    validations = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["event"] == "validation"]
    assert len(validations) == 1 and 0 <= validations[0]["val_error"] <= 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    status, out, err = run_test_py(capsys, "--checkpoint", str(save))
    assert status == 0, err
    assert f"the validation part carved from {root / 'train'}/ (25%) (6 samples)" in out


def test_in_async_mode_every_worker_names_its_bad_samples_and_one_past_the_limit_stops_and_saves_the_run(
        images, tmp_path, monkeypatch, capsys):
    """Async workers count their bad samples alone (they never wait for each other): each logs its own through the
    server, the first past the limit stops every worker at the next consistent point, where the run saves, and the
    error names every worker's."""
    root = damaged(images, tmp_path)
    save = tmp_path / "m.pt"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    status = Train.main(flags(root, "--mode", "async", "--max-staleness", "1", "--avg-every", "4",
                              "--max-bad-samples", "1", "--epochs", "20", "--save", str(save),
                              "--log-dir", str(tmp_path / "log")))
    err = capsys.readouterr().err
    assert status == 1, err
    records = bad_records(tmp_path / "log")
    assert {r["rank"] for r in records} == {0, 1}
    assert f"{len({r['path'] for r in records})} bad samples, more than --max-bad-samples 1" in err
    for path in {r["path"] for r in records}:
        assert f"{path}: cannot be decoded" in err
    assert f"continue with --resume {save}" in err
    assert load_checkpoint(save)["step"] < 20 * 6         # saved where the group stopped, long before the budget's end
