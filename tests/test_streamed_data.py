"""Streamed datasets and the input pipeline, in this process: image folders, token files, factories."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from harness.checkout.datasets import DataError, check_data, open_data
from harness.checkout.datasets.imagefolder import random_resized_crop
from harness.data.pipeline import EvaluationBatches, Seeded, ShardSampler, StreamedBatches, evaluation_batches
from tests.helpers.data_files import make_token_files
from tests.helpers.processes import descendants, wait_gone

CROP = {"crop": 16, "resize": 20}




@pytest.mark.parametrize("decoder", ["simplejpeg", "pillow"])
def test_imagefolder_scans_classes_and_decodes_uint8_crops(images, decoder):
    data = open_data("imagefolder", str(images), decoder=decoder, **CROP)
    assert (len(data.train), len(data.val)) == (24, 6) and data.test is data.val
    assert data.info.class_names == ("c0", "c1", "c2") and data.info.input_shape == (3, 16, 16)
    assert data.train.labels.tolist() == [0] * 8 + [1] * 8 + [2] * 8
    assert data.train.path(9).name == "001.jpg" and data.train.path(9).parent.name == "c1"
    x, y = data.val[3]
    assert x.dtype == torch.uint8 and x.shape == (3, 16, 16) and y == 1
    assert torch.equal(data.val[3][0], x)                       # evaluation: resize + centre crop, no chance


def test_a_split_is_listed_once_a_process_until_a_class_folder_changes(images, tmp_path, monkeypatch):
    shutil.copytree(images, tmp_path / "images")
    listed = []
    scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda path: listed.append(os.path.basename(path)) or scandir(path))
    first, again = (open_data("imagefolder", str(tmp_path / "images"), **CROP) for _ in range(2))
    assert listed.count("c1") == 2      # train/c1 and val/c1, once: rank 0's checks and training share it
    assert again.train.labels is first.train.labels and not first.train.labels.flags.writeable
    shutil.copy(tmp_path / "images" / "train" / "c1" / "001.jpg", tmp_path / "images" / "train" / "c1" / "new.jpg")
    grown = open_data("imagefolder", str(tmp_path / "images"), **CROP)
    assert listed.count("c1") == 3 and len(grown.train) == len(first.train) + 1
    assert grown.train.path(grown.train.labels.tolist().index(2) - 1).name == "new.jpg"


@pytest.mark.parametrize("decoder", ["simplejpeg", "pillow"])
def test_training_crops_depend_on_the_sample_seed_only(images, decoder):
    train = Seeded(open_data("imagefolder", str(images), decoder=decoder, **CROP).train)
    (a, _), (b, _), (c, _) = (train[key][0] for key in ((5, 11), (5, 11), (5, 12)))     # (sample, failures)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_the_two_decoders_agree_and_other_formats_decode_too(images, tmp_path):
    fast, exact = (open_data("imagefolder", str(images), decoder=d, **CROP).val for d in ("simplejpeg", "pillow"))
    for i in range(len(fast)):
        assert (fast[i][0].float() - exact[i][0].float()).abs().mean() < 3      # fast IDCT: within a few levels
    from PIL import Image
    Image.open(images / "val" / "c0" / "000.jpg").save(images / "val" / "c0" / "extra.png")
    try:
        png = open_data("imagefolder", str(images), **CROP).val
        assert png[2][0].shape == (3, 16, 16) and png.path(2).suffix == ".png"
    finally:
        (images / "val" / "c0" / "extra.png").unlink()
    with pytest.raises(DataError, match="decoder 'turbo' is not one of simplejpeg, pillow"):
        open_data("imagefolder", str(images), decoder="turbo")
    with pytest.raises(DataError, match="decoder 'nvjpeg' is no longer offered .* simplejpeg"):
        open_data("imagefolder", str(images), decoder="nvjpeg")


def test_random_resized_crop_boxes_stay_inside_and_in_range():
    import random
    random.seed(0)
    for width, height in [(500, 375), (40, 30), (30, 300), (1000, 20)]:
        for _ in range(200):
            left, top, w, h = random_resized_crop(width, height)
            assert 0 <= left and 0 <= top and left + w <= width and top + h <= height and w > 0 and h > 0


def test_token_windows_are_shifted_pairs_read_from_the_file(tokens):
    data = open_data("tokens", str(tokens), block_size=32, vocab_size=64, val_windows=10)
    raw = np.fromfile(tokens / "train.bin", dtype=np.uint16).astype(np.int64)
    assert len(data.train) == (12_000 - 1) // 32 and len(data.val) == 10
    x, y = data.train[7]
    assert torch.equal(x, torch.from_numpy(raw[7 * 32:8 * 32])) and torch.equal(y, torch.from_numpy(raw[7 * 32 + 1:8 * 32 + 1]))
    assert data.info.kind == "tokens" and data.info.input_shape == (32,) and data.info.num_classes == 64
    stride = ((2_000 - 1) // 32) // 10
    val_raw = np.fromfile(tokens / "val.bin", dtype=np.uint16).astype(np.int64)
    assert torch.equal(data.val[2][0], torch.from_numpy(val_raw[2 * stride * 32:2 * stride * 32 + 32]))


def test_sampler_gives_each_rank_a_disjoint_shard_and_resumes_mid_epoch():
    ranks = [ShardSampler(50, r, 2, 4, seed=3) for r in range(2)]
    seen = [key for sampler in ranks for batch in sampler for key in batch]
    assert len({i for i, _ in seen}) == len(seen) == 2 * 6 * 4
    whole = list(ranks[0])
    ranks[0].position = (0, 4)
    assert list(ranks[0]) == whole[4:] and len(ranks[0]) == 2
    ranks[0].position = (1, 0)
    assert list(ranks[0]) != whole


@pytest.mark.parametrize("workers", [0, 1])
def test_streamed_batches_equal_the_samples_in_the_sampler_order(images, workers):
    dataset = open_data("imagefolder", str(images), **CROP).train
    batches = StreamedBatches(dataset, 1, 2, 4, seed=0, device=torch.device("cpu"), workers=workers)
    try:
        got = list(batches.epoch(2, start=1))
        keys = list(batches.sampler)
    finally:
        batches.close()
    assert len(got) == batches.steps_per_epoch - 1 == 2
    seeded = Seeded(dataset)
    for (x, y), batch in zip(got, keys):
        expected = torch.stack([seeded[key][0][0] for key in batch]).float()      # (sample, failures)'s x
        mean = torch.tensor(dataset.info.mean).view(1, -1, 1, 1) * 255
        std = torch.tensor(dataset.info.std).view(1, -1, 1, 1) * 255
        assert x.dtype == torch.float32 and torch.allclose(x, (expected - mean) / std)
        assert y.tolist() == [dataset.labels[i] for i, _ in batch]


def test_evaluation_batches_cover_every_sample_once(tokens):
    val = open_data("tokens", str(tokens), block_size=32, vocab_size=64, val_windows=25).val
    index = {tuple(val[i][0].tolist()): i for i in range(len(val))}
    assert len(index) == len(val) == 25                 # every window tells which sample it is
    seen = {rank: [index[tuple(row.tolist())] for x, _ in evaluation_batches(val, rank, 3, 4, torch.device("cpu"))
                   for row in x] for rank in range(3)}
    assert seen == {rank: list(range(rank, 25, 3)) for rank in range(3)}     # each sample once, rank r every 3rd


def test_evaluation_passes_load_in_the_process_forked_when_made(tokens):
    """Each pass is evaluation_batches' share, from the loader process EvaluationBatches forked when it was made."""
    val = open_data("tokens", str(tokens), block_size=32, vocab_size=64, val_windows=25).val
    evaluation = EvaluationBatches(val, 4, torch.device("cpu"), workers=1)
    try:
        forked = set(descendants(os.getpid()))
        for share in ((1, 3), (0, 1)):              # a rank's share, then the whole split (--mode async)
            passed = evaluation(*share, [])
            got = [next(passed)]
            assert set(descendants(os.getpid())) == forked     # the pass forked nothing
            got += passed
            expected = list(evaluation_batches(val, *share, 4, torch.device("cpu")))
            assert len(got) == len(expected) and all(torch.equal(a, b) for g, e in zip(got, expected)
                                                     for a, b in zip(g, e))
    finally:
        evaluation.close()


def test_check_data_reports_facts_without_generating_synthetic_data():
    facts = check_data("synthetic", shape=[3, 224, 224], num_classes=1000, size=10**7, val_fraction=0.1)
    assert facts.info.input_shape == (3, 224, 224) and facts.samples == 9 * 10**6 and facts.validated
    assert facts.train is None      # described, not generated


@pytest.mark.parametrize("breakage, message, dtype", [
    (lambda root: (root / "train.bin").write_bytes(b"\x01\x00\x02"), "not a multiple of 2", "uint16"),
    (lambda root: np.arange(5000, dtype=np.uint32).tofile(root / "train.bin"), "looks like uint32", "uint16"),
    (lambda root: (np.arange(5000) % 64).tofile(root / "train.bin"), r"looks like int64 ids \(read as uint16, only "
                                                                     "one value in 4", "uint16"),
    (lambda root: (np.arange(5000) % 64).tofile(root / "train.bin"), "looks like int64 ids", "uint32"),
    (lambda root: np.full(5000, 900, dtype=np.uint16).tofile(root / "train.bin"), "token id 900 >= vocab_size 64",
     "uint16"),
    (lambda root: np.arange(20, dtype=np.uint16).tofile(root / "train.bin"), "fewer than one window", "uint16"),
    (lambda root: (root / "val.bin").unlink(), "val.bin does not exist", "uint16"),
])
def test_bad_token_files_are_named_with_the_fix(tmp_path, breakage, message, dtype):
    root = make_token_files(tmp_path / "tokens", vocab=64)
    breakage(root)
    with pytest.raises((DataError, FileNotFoundError), match=message) as error:
        check_data("tokens", str(root), block_size=32, vocab_size=64, dtype=dtype)
    assert "train.bin" in str(error.value) or "val.bin" in str(error.value)


def test_factory_datasets_get_their_info_from_samples_and_classes(tmp_path, monkeypatch):
    (tmp_path / "my_data.py").write_text(
        "import torch\n"
        "class Points(torch.utils.data.Dataset):\n"
        "    classes = ['left', 'right']\n"
        "    def __init__(self, n): self.n = n\n"
        "    def __len__(self): return self.n\n"
        "    def __getitem__(self, i): return torch.full((3,), float(i)), i % 2\n"
        "def make(split, data_dir, size=10):\n"
        "    return Points(size) if split == 'train' else None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = open_data("my_data:make", None, size=12)
    assert len(data.train) == 12 and data.val is None and data.test is None
    assert data.info.kind == "vector" and data.info.input_shape == (3,) and data.info.class_names == ("left", "right")
    with pytest.raises(ValueError, match="has no callable 'nothing'"):
        open_data("my_data:nothing")


def test_a_dataset_factory_s_options_may_be_named_as_the_harness_s_own_arguments(tmp_path, monkeypatch):
    """--dataset-options '{"name": ...}' (a Hugging Face dataset's name, say) met open_data's and check_data's own
    ``name``: "got multiple values for argument 'name'"."""
    (tmp_path / "named_data.py").write_text(
        "import torch\n"
        "def make(split, data_dir, name, spec, signature):\n"
        "    n = len(name + spec + signature)\n"
        "    return torch.utils.data.TensorDataset(torch.zeros(n, 2), torch.arange(n) % 2) if split == 'train' else None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    options = {"name": "wikitext", "spec": "x", "signature": ""}
    assert len(open_data("named_data:make", None, **options).train) == 9
    assert check_data("named_data:make", None, **options).samples == 9


def test_reading_windows_does_not_pile_mapped_pages_onto_the_reader(tmp_path):
    """Without unmapping after each read, 3000 random windows of a 512 MB file map at least 3000 x 64 KB."""
    from harness.training.metrics import worker_memory_mb
    root = make_token_files(tmp_path, train_tokens=10, val_tokens=4096, vocab=64)
    np.random.default_rng(0).integers(0, 64, 256 << 20, dtype=np.uint16).tofile(root / "train.bin")
    train = open_data("tokens", str(root), block_size=64, vocab_size=64).train
    train[0]
    before = worker_memory_mb()
    for index in np.random.default_rng(1).integers(0, len(train), 3000):
        train[int(index)]
    assert worker_memory_mb() - before < 20


def test_uint8_token_ids_stay_ids_on_the_way_to_the_device():
    from harness.checkout.datasets import DataInfo
    from harness.data.pipeline import to_device
    dataset = type("Bytes", (), {"info": DataInfo("tokens", (4,), 256)})()
    ids = torch.tensor([[0, 7, 255, 3]], dtype=torch.uint8)
    (x, _), = to_device([(ids, ids)], torch.device("cpu"), dataset)
    assert torch.equal(x, ids)


def test_loader_processes_end_with_a_training_process_killed_outright(tmp_path):
    """A dead rank's idle loader processes must not outlive it (their own watchdog looks every 5 s)."""
    script = textwrap.dedent("""
        import time, torch
        from harness.checkout.datasets import DataInfo
        from harness.data.pipeline import evaluation_batches

        class Quick(torch.utils.data.Dataset):
            info = DataInfo("vector", (2,), 2)
            def __len__(self):
                return 64
            def __getitem__(self, i):
                return torch.zeros(2), 0

        batches = evaluation_batches(Quick(), 0, 1, 4, torch.device("cpu"), workers=2)
        next(batches)
        time.sleep(1.0)                       # the loaders have filled their prefetch and idle
        print("loading", flush=True)
        time.sleep(600)
    """)
    trainer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert trainer.stdout.readline().strip() == "loading"
        loaders = descendants(trainer.pid)
        assert len(loaders) == 2
        trainer.kill()
        trainer.wait()
        assert wait_gone(loaders, 1.5) == []
    finally:
        trainer.kill()


def test_a_token_id_beyond_the_vocabulary_past_what_the_checks_read_is_a_bad_sample_naming_the_file(tmp_path):
    """The checks read the first PROBE_TOKENS ids; a window past them with an id the model cannot embed failed in the
    embedding, mid-run, naming neither the file nor the id. It is a bad sample now, skipped and logged."""
    from harness.checkout.datasets.tokens import PROBE_TOKENS, open_tokens
    from harness.checkout.datasets.split import SampleError
    root = make_token_files(tmp_path / "tokens", vocab=64)
    ids = np.arange(PROBE_TOKENS + 4096, dtype=np.uint16) % 64
    at = PROBE_TOKENS + 1000
    ids[at] = 900
    ids.tofile(root / "train.bin")
    train, _ = open_tokens(str(root), block_size=32, vocab_size=64)
    train.check()                                           # the first ids are fine
    with pytest.raises(SampleError, match=rf"{root / 'train.bin'} has token id 900 >= vocab_size 64 at token {at}; "
                                          "pass the right vocab_size"):
        train[at // 32]
