"""Train.py on streamed data end to end, on CPU workers: exact mid-epoch resume for every kind of
streamed dataset, one-line errors for bad data, a corrupt file met mid-run, the memory bound, validation's
loader processes forked once, and Hugging Face's `datasets` package left to user code."""
from __future__ import annotations

import json
import os
import shutil
import textwrap

import pytest

import Train
from harness.training import ConfigError
from harness.training.checks import check
from harness.resilience.checkpoint import load_checkpoint
from tests.helpers.data_files import make_token_files
from tests.helpers.training import cli, run_train, stop_and_resume

FACTORY = textwrap.dedent("""
    import torch

    class Noisy(torch.utils.data.Dataset):
        '''Vectors with fresh noise per draw (torch's global generator), like a random augmentation;
        an `x` and an `info` of its own must not confuse the harness.'''
        classes = ["a", "b", "c"]
        info = "not the harness's DataInfo"

        def __init__(self, n):
            self.n = n
            self.x = list(range(n))

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return torch.full((6,), float(i % 3)) + 0.3 * torch.randn(6), i % 3

    def make(split, data_dir, size=60):
        return Noisy(size if split == "train" else 12)

    def model(info):
        return torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Dropout(0.3), torch.nn.ReLU(),
                                   torch.nn.Linear(32, info.num_classes))
""")




def dataset_flags(kind, images, tokens, tmp_path):
    if kind == "imagefolder":      # 24 images, 2 workers x batch 2: 6 steps an epoch
        return ["--dataset", "imagefolder", "--data-dir", str(images), "--dataset-options",
                '{"crop": 16, "resize": 20}', "--batch-size", "2", "--data-workers", "1"]
    if kind == "tokens":           # dropout draws from each rank's generator: resuming must restore it
        return ["--dataset", "tokens", "--data-dir", str(tokens), "--dataset-options",
                '{"block_size": 16, "vocab_size": 64, "val_windows": 8}', "--model", "gpt",
                "--model-options", '{"dropout": 0.1}', "--batch-size", "64", "--optimizer", "adamw", "--lr", "0.002"]
    (tmp_path / "noisy_data.py").write_text(FACTORY)      # validation at the stop draws in the training process
    return ["--dataset", "noisy_data:make", "--model", "noisy_data:model", "--batch-size", "4", "--data-workers", "0"]


@pytest.mark.parametrize("kind", ["imagefolder", "tokens", "factory"])
def test_stop_and_resume_mid_epoch_equals_a_straight_run(kind, images, tokens, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))          # the factory's module, for the children too
    straight, resumed, results, stopped = stop_and_resume(tmp_path, dataset_flags(kind, images, tokens, tmp_path), 4, 10)
    assert {r["step"] for r in results} == {10}
    assert (stopped["step"], stopped["position"], stopped["epoch"]) == (4, 4, 0) and len(stopped["rng"]) == 2
    assert (straight - resumed).norm() <= 1e-6 * resumed.norm()


def test_resume_mid_epoch_refuses_a_training_set_of_another_size(tmp_path):
    _, save = run_train(tmp_path, "--batch-size", "8", "--max-steps", "30")
    assert load_checkpoint(save)["position"] == 30
    args = Train.parse_args(["--batch-size", "8", "--val-fraction", "0.9", "--resume", str(save), "--log-dir", str(tmp_path)])
    with pytest.raises(ConfigError, match="a training set of 1294 samples.*stopped mid-epoch"):
        check(args)


def test_saves_every_n_steps_mid_epoch_and_resume_refuses_another_layout(images, tmp_path):
    flags = dataset_flags("imagefolder", images, None, tmp_path)
    _, save = run_train(tmp_path, *flags, "--max-steps", "9", "--save-every-steps", "4", "--data-workers", "0")
    saved = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in saved if r["event"] == "saved"] == [4, 6, 8, 9]     # 6: the epoch's end
    assert [r["event"] for r in saved].count("first_step") == 1
    assert load_checkpoint(save)["position"] == 3
    args = Train.parse_args([*flags, "--batch-size", "1", "--resume", str(save), "--log-dir", str(tmp_path)])
    with pytest.raises(ConfigError, match="--batch-size 2.*stopped mid-epoch"):
        check(args)


def broken(tmp_path, images, damage):
    """A copy of the image folder, damaged (each step raises if it fails: the test sees its own breakage)."""
    root = shutil.copytree(images, tmp_path / "broken")
    damage(root)
    return root


def empty(folder):
    for entry in folder.iterdir():
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()


@pytest.mark.parametrize("damage, message", [
    (lambda root: None, "--dataset imagefolder needs --data-dir"),
    (lambda root: shutil.rmtree(root / "train"), "train does not exist"),
    (lambda root: empty(root / "train"), "train has no class folders"),
    (lambda root: empty(root / "train" / "c1"), "class folder .*/train/c1 has no images"),
])
def test_bad_image_folders_are_one_line_errors_before_any_worker(damage, message, images, tmp_path):
    root = broken(tmp_path, images, damage)
    where = [] if "needs --data-dir" in message else ["--data-dir", str(root)]
    args = Train.parse_args(["--dataset", "imagefolder", *where, "--save", str(tmp_path / "m.pt"),
                             "--log-dir", str(tmp_path)])
    with pytest.raises(ConfigError, match=message) as error:
        check(args)
    assert "\n" not in str(error.value)


def test_bad_token_file_is_one_line_on_the_command_line(tokens, tmp_path):
    root = tmp_path / "tokens"
    root.mkdir()
    (root / "train.bin").write_bytes(b"\x01\x02\x03")
    (root / "val.bin").write_bytes((tokens / "val.bin").read_bytes())
    result = cli("Train.py", "--dataset", "tokens", "--data-dir", str(root), "--model", "gpt",
                 "--log-dir", str(tmp_path), "--save", str(tmp_path / "m.pt"), env={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert f"{root / 'train.bin'} has 3 bytes, not a multiple of 2" in result.stderr
    assert not (tmp_path / "m.pt").exists()


def test_a_corrupt_image_met_mid_run_names_the_file_and_keeps_the_last_checkpoint(images, tmp_path, monkeypatch,
                                                                                 capsys):
    root = broken(tmp_path, images, lambda root: (root / "train" / "c2" / "005.jpg").write_bytes(b"\xff\xd8garbage"))
    save = tmp_path / "m.pt"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    status = Train.main(["--dataset", "imagefolder", "--data-dir", str(root), "--dataset-options",      # in this process
                         '{"crop": 16, "resize": 20}', "--batch-size", "2", "--epochs", "3", "--save-every-steps", "1",
                         "--data-workers", "1", "--max-bad-samples", "0", "--save", str(save), "--log-dir",
                         str(tmp_path / "log")])
    err = capsys.readouterr().err
    assert status == 1, err
    assert f"{root}/train/c2/005.jpg: cannot be decoded" in err
    state = load_checkpoint(save)                     # intact, and from before the failure
    assert 1 <= state["step"] < 18


def test_worker_memory_does_not_grow_with_the_token_file(tmp_path):
    """A 100 MB and a 2 GB file (sparse, so the test writes nothing): resident memory per worker,
    its loader process included, differs by far less than 100 MB."""
    memory = {}
    for name, size in (("small", 100 << 20), ("large", 2 << 30)):
        root = make_token_files(tmp_path / name, train_tokens=10, val_tokens=4096, vocab=64)
        with open(root / "train.bin", "wb") as f:
            f.truncate(size)
        results, _ = run_train(tmp_path, "--dataset", "tokens", "--data-dir", str(root), "--dataset-options",
                               '{"block_size": 1024, "vocab_size": 64, "val_windows": 2}', "--model", "gpt",
                               "--batch-size", "2", "--max-steps", "5", "--data-workers", "1", name=name)
        memory[name] = max(r["memory_mb"] for r in results)
    assert memory["small"] > 50                      # it measured something: torch alone is more
    assert abs(memory["large"] - memory["small"]) < 100, memory


def test_every_validation_of_a_rank_loads_in_the_loader_process_forked_at_its_start(tmp_path):
    """3 epochs, each validated: each rank's validation samples are loaded by one process, forked before the
    communicator (harness/data/pipeline.py: EvaluationBatches says how a later fork hangs a run)."""
    user = "tests.helpers.user_code"
    run_train(tmp_path, "--model", f"{user}:linear", "--dataset", f"{user}:loads", "--loss", f"{user}:mse",
              "--data-dir", str(tmp_path), "--batch-size", "32", "--epochs", "3", "--cpu-workers", "2",
              "--data-workers", "1")
    loaders = set((tmp_path / "val.pids").read_text().split()) - {str(os.getpid())}     # not the parent's checks
    assert len(loaders) == 2


def test_user_code_gets_hugging_face_datasets_in_every_child(tmp_path):
    site, user, elsewhere = tmp_path / "site", tmp_path / "user", tmp_path / "cwd"
    (site / "datasets").mkdir(parents=True)
    (site / "datasets" / "__init__.py").write_text("def load_dataset(name):\n    return ['stand-in', name]\n")
    user.mkdir()
    (user / "hf_user.py").write_text(textwrap.dedent("""
        import os
        import torch
        from datasets import load_dataset        # must be the installed package, never the harness's

        def make(split, data_dir):
            assert load_dataset("digits") == ["stand-in", "digits"], "the harness's datasets/ shadowed it"
            with open(os.path.join(os.environ["MARKS"], f"{os.getpid()}-{split}"), "w"):
                pass
            x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
            dataset = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
            dataset.classes = ["negative", "positive"]
            return dataset if split == "train" else None
    """))
    marks = tmp_path / "marks"
    marks.mkdir()
    elsewhere.mkdir()
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(user), os.environ.get("PYTHONPATH", "")]),
           "MARKS": str(marks), "CUDA_VISIBLE_DEVICES": ""}
    result = cli("Train.py", "--dataset", "hf_user:make", "--dataset-options", "{}", "--epochs", "1",
                 "--batch-size", "8", "--save", str(tmp_path / "m.pt"), "--log-dir", str(tmp_path / "l"),
                 env=env, cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    pids = {name.split("-")[0] for name in os.listdir(marks)}
    assert len(pids) == 2               # both workers imported the stand-in (rank 0 also for its checks)


def test_num_classes_cannot_be_guessed_is_a_clear_error(tmp_path, monkeypatch):
    (tmp_path / "plain_data.py").write_text(
        "import torch\n"
        "def make(split, data_dir):\n"
        "    return torch.utils.data.TensorDataset(torch.zeros(8, 3), torch.zeros(8).long())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    args = Train.parse_args(["--dataset", "plain_data:make", "--log-dir", str(tmp_path)])
    with pytest.raises(ConfigError, match="cannot tell the number of classes"):
        check(args)
