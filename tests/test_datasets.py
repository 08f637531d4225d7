import gzip
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from harness.checkout.datasets import digits
from harness.checkout.datasets import DATASETS, DataInfo, Split, dataset_names, decode_oddeven, load_dataset
from harness.checkout.datasets.sharding import shard_indices


def test_registry_lists_all_datasets():
    assert sorted(DATASETS) == ["cifar10", "digits", "mnist", "oddeven", "synthetic"]
    assert dataset_names() == ["cifar10", "digits", "imagefolder", "mnist", "oddeven", "synthetic", "tokens"]


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown dataset 'imagenet' \(did you mean 'imagefolder'\?\); valid names: "
                                         r"cifar10, digits"):
        load_dataset("imagenet")


def test_split_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="x has 3 samples but y has 2"):
        Split(torch.zeros(3, 2), torch.zeros(2), DataInfo("vector", (2,), 2))


def test_digits_fixed_split_scaled_images():
    train, test = load_dataset("digits", seed=0)
    _, test_other_seed = load_dataset("digits", seed=7)
    assert torch.equal(test.x, test_other_seed.x)
    assert (len(train), len(test)) == (1437, 360)
    assert train.x.shape[1:] == (1, 8, 8) and train.x.dtype == torch.float32
    assert 0.0 <= train.x.min() and train.x.max() <= 1.0
    assert train.info == DataInfo("image", (1, 8, 8), 10, tuple("0123456789"))
    assert torch.bincount(test.y).min() >= 35  # stratified: every digit is in the test set


def test_digits_are_cached_and_the_cache_loads_without_sklearn(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    built = load_dataset("digits")                      # no cache yet: sklearn builds it
    assert digits.cache_path().parent == tmp_path / "harness" and digits.cache_path().is_file()
    check = ("import sys, torch; from harness.checkout.datasets import load_dataset; "
             "train, test = load_dataset('digits'); torch.save((train.x, test.y), sys.argv[1]); "
             "print(sorted(m for m in sys.modules if m.startswith('sklearn')))")
    out = subprocess.run([sys.executable, "-c", check, str(tmp_path / "read.pt")], capture_output=True, text=True,
                         env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)}, check=True).stdout
    assert out.strip() == "[]"
    x, y = torch.load(tmp_path / "read.pt")
    assert torch.equal(x, built[0].x) and torch.equal(y, built[1].y)
    digits.cache_path().write_bytes(b"torn")            # a broken cache is rebuilt, not an error
    assert torch.equal(load_dataset("digits")[1].x, built[1].x)
    assert torch.load(digits.cache_path())[0].shape == (1797, 1, 8, 8)


def test_oddeven_bits_labels_and_split():
    train, test = load_dataset("oddeven")
    n_train, n_test = decode_oddeven(train.x), decode_oddeven(test.x)
    assert train.x.shape[1:] == (10,) and train.x.dtype == torch.float32
    assert torch.equal(torch.cat([n_train, n_test]).sort().values, torch.arange(1024))
    assert torch.equal(train.y, n_train % 2) and torch.equal(test.y, n_test % 2)
    assert train.info.class_names == ("even", "odd")
    assert torch.equal(load_dataset("oddeven", seed=5)[1].x, test.x)


def test_synthetic_images_are_deterministic_and_learnable():
    train, test = load_dataset("synthetic", shape=(3, 8, 8), num_classes=4, size=1024, seed=1)
    again, _ = load_dataset("synthetic", shape=(3, 8, 8), num_classes=4, size=1024, seed=2)
    assert torch.equal(train.x, again.x) and torch.equal(train.y, again.y)
    assert (len(train), len(test)) == (1024, 256)
    assert train.info == DataInfo("image", (3, 8, 8), 4)
    assert torch.bincount(train.y, minlength=4).min() > 0

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4))
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    for _ in range(60):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(train.x), train.y).backward()
        opt.step()
    accuracy = (model(test.x).argmax(1) == test.y).float().mean()
    assert accuracy > 0.8


def test_synthetic_vectors():
    train, _ = load_dataset("synthetic", shape=(12,), num_classes=3, size=64)
    assert train.x.shape == (64, 12) and train.info.kind == "vector"


def test_synthetic_tokens_follow_a_fixed_rule():
    train, test = load_dataset("synthetic", tokens=True, seq_len=16, vocab_size=32, size=256)
    assert train.x.shape == train.y.shape == (256, 16) and train.x.dtype == train.y.dtype == torch.int64
    assert train.info == DataInfo("tokens", (16,), 32)
    assert torch.equal(train.x[:, 1:], train.y[:, :-1])
    rule = torch.full((32,), -1)
    rule[train.x.flatten()] = train.y.flatten()
    assert torch.equal(rule[test.x], test.y)  # one next token per token, shared by train and test


def write_idx(path, array: np.ndarray, magic: int, compress: bool) -> None:
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    opener = gzip.open if compress else open
    with opener(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_mnist_reads_plain_and_gzipped_idx(tmp_path):
    rng = np.random.default_rng(0)
    images = {"train": rng.integers(0, 256, (5, 28, 28)), "t10k": rng.integers(0, 256, (3, 28, 28))}
    for prefix, imgs in images.items():
        compress = prefix == "train"
        suffix = ".gz" if compress else ""
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte{suffix}", imgs, 2051, compress)
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte{suffix}", np.arange(len(imgs)), 2049, compress)
    train, test = load_dataset("mnist", data_dir=str(tmp_path))
    assert train.x.shape == (5, 1, 28, 28) and test.x.shape == (3, 1, 28, 28)
    torch.testing.assert_close(test.x[:, 0], torch.from_numpy(images["t10k"] / 255.0).float())
    assert torch.equal(train.y, torch.arange(5))
    assert train.info.input_shape == (1, 28, 28) and train.info.num_classes == 10


def test_mnist_missing_file_says_where_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("mnist", data_dir=str(tmp_path))
    message = str(err.value)
    assert "train-images-idx3-ubyte" in message and str(tmp_path) in message and "yann.lecun.com" in message


def write_cifar(root, names: tuple[str, ...] | None) -> None:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate([f"data_batch_{j}" for j in range(1, 6)] + ["test_batch"]):
        batch = {b"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8), b"labels": [i, 9 - i]}
        (root / name).write_bytes(pickle.dumps(batch))
    if names:
        (root / "batches.meta").write_bytes(pickle.dumps({b"label_names": [n.encode() for n in names]}))


def test_cifar10_reads_batches_and_class_names(tmp_path):
    names = tuple(f"class{i}" for i in range(10))
    write_cifar(tmp_path / "cifar-10-batches-py", names)
    train, test = load_dataset("cifar10", data_dir=str(tmp_path))
    assert train.x.shape == (10, 3, 32, 32) and test.x.shape == (2, 3, 32, 32)
    assert train.x.dtype == torch.float32 and 0 <= train.x.min() and train.x.max() <= 1
    assert train.y.tolist() == [0, 9, 1, 8, 2, 7, 3, 6, 4, 5] and test.y.tolist() == [5, 4]
    assert train.info.class_names == names


def test_cifar10_without_meta_uses_standard_names(tmp_path):
    write_cifar(tmp_path, None)
    train, _ = load_dataset("cifar10", data_dir=str(tmp_path))
    assert train.info.class_names[0] == "airplane" and len(train.info.class_names) == 10


def test_cifar10_missing_file_says_where_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data_batch_1.*cs.toronto.edu/~kriz/cifar.html"):
        load_dataset("cifar10", data_dir=str(tmp_path))


@pytest.mark.parametrize("n, world_size, batch", [(103, 4, 5), (64, 2, 8), (50, 3, 4), (7, 7, 1)])
def test_rank_batches_together_equal_single_process_batch(n, world_size, batch):
    usable = n - n % world_size
    single = shard_indices(n, 0, 1, epoch=3, seed=11)[:usable]
    shards = [shard_indices(n, r, world_size, epoch=3, seed=11) for r in range(world_size)]
    assert {len(s) for s in shards} == {usable // world_size}
    for k in range(len(shards[0]) // batch):
        union = torch.cat([s[k * batch : (k + 1) * batch] for s in shards])
        big = single[k * world_size * batch : (k + 1) * world_size * batch]
        assert torch.equal(union.sort().values, big.sort().values)


def test_shards_are_disjoint_and_vary_by_epoch_and_seed():
    shards = [shard_indices(100, r, 4, epoch=0, seed=0) for r in range(4)]
    assert torch.equal(torch.cat(shards).sort().values, torch.arange(100))
    assert torch.equal(shard_indices(100, 1, 4, epoch=0, seed=0), shards[1])
    assert not torch.equal(shard_indices(100, 1, 4, epoch=1, seed=0), shards[1])
    assert not torch.equal(shard_indices(100, 1, 4, epoch=0, seed=1), shards[1])


def test_unshuffled_shards_interleave_in_order():
    assert shard_indices(10, 1, 3, epoch=5, seed=5, shuffle=False).tolist() == [1, 4, 7]


@pytest.mark.parametrize(
    "n, rank, world_size, match",
    [(10, 2, 2, "rank=2 is out of range"), (10, -1, 2, "rank=-1"), (10, 0, 0, "world_size=0"), (3, 0, 4, "n=3")],
)
def test_bad_shard_arguments_raise(n, rank, world_size, match):
    with pytest.raises(ValueError, match=match):
        shard_indices(n, rank, world_size, epoch=0, seed=0)
