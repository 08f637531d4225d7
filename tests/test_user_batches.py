"""Your model, your loss, your batches: dict batches passed as keyword arguments with a collate_fn of
one's own, models that return their own loss, --loss with a regression target, and a Hugging Face
GPT2LMHeadModel (built from a config, nothing downloaded) on a datasets.Dataset, on 2 CPU workers."""
from __future__ import annotations

import json

import pytest

import Test
from harness.training.metrics import read_metrics
from tests.helpers.training import run_test_py, run_train, stop_and_resume, train_error

USER = "tests.helpers.user_code"


def epochs_of(tmp_path, name: str) -> list[dict]:
    return [r for r in read_metrics(tmp_path / name / "metrics.jsonl") if r["event"] == "epoch"]


def test_a_dict_batch_model_with_its_own_loss_trains_and_resumes_exactly(tmp_path):
    flags = ["--model", f"{USER}:own_loss_model", "--dataset", f"{USER}:dict_tokens", "--batch-size", "8",
             "--lr", "0.5", "--data-workers", "0"]
    # 128 samples, 2 workers x 8: 8 updates an epoch; the straight run's 32 are 4 epochs, in which the model learns
    straight, resumed, results, _ = stop_and_resume(tmp_path, flags, 5, 32)
    assert len({r["checksum"] for r in results}) == 1
    assert (straight - resumed).norm() <= 1e-6 * straight.norm()
    epochs = epochs_of(tmp_path, "straight")
    losses = [r["train_loss"] for r in epochs]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert all(r["val_error"] is None and r["val_loss"] > 0 for r in epochs)


def test_loss_names_a_regression_loss_of_ones_own(tmp_path, capsys):
    """A regression's float targets (and its single output) are no class labels: no classification error in
    validation, and Test.py reports the loss alone."""
    _, saved = run_train(tmp_path, "--model", f"{USER}:linear", "--dataset", f"{USER}:regression", "--loss",
                         f"{USER}:mse", "--epochs", "6", "--lr", "0.05", "--batch-size", "16", name="mse")
    epochs = epochs_of(tmp_path, "mse")
    assert epochs[-1]["train_loss"] < 0.1 * epochs[0]["train_loss"] and epochs[-1]["val_loss"] < 0.1
    assert all(r["val_error"] is None for r in epochs)
    status, out, _ = run_test_py(capsys, "--checkpoint", str(saved), "--json")
    result = json.loads(out)
    assert status == 0 and result["loss"] < 0.1 and result["accuracy"] is None
    assert result["per_class_accuracy"] == [] and result["confusion_matrix"] is None and result["examples"] == []


def test_labels_given_one_per_row_as_shape_1_are_counted_as_classes(tmp_path, capsys):
    """Labels of shape (1,) per sample (a dataframe's column) train under the default loss, and validation and
    Test.py count their accuracy as for labels of shape (): they reported none."""
    _, saved = run_train(tmp_path, "--model", f"{USER}:two_classes", "--dataset", f"{USER}:column_labels",
                         "--epochs", "4", "--lr", "0.5", "--batch-size", "16", name="column")
    epochs = epochs_of(tmp_path, "column")
    assert all(r["val_error"] is not None for r in epochs) and epochs[-1]["val_error"] < 0.2
    status, out, _ = run_test_py(capsys, "--checkpoint", str(saved), "--json")
    result = json.loads(out)
    assert status == 0 and result["accuracy"] > 0.8 and result["samples"] == 64
    assert len(result["per_class_accuracy"]) == 2
    assert {e["label"] for e in result["examples"]} <= {"negative", "positive"}
    assert result["examples"]


def test_a_model_that_returns_a_plain_dict_with_its_loss_is_trained_on_that_loss():
    from harness.training import TrainConfig
    from harness.training.checks import check
    check(TrainConfig(model=f"{USER}:dict_output_model", dataset=f"{USER}:dict_tokens", batch_size=2, save=None))


def test_a_hugging_face_causal_lm_on_a_token_file_trains_on_the_cross_entropy_of_its_logits(tmp_path):
    """Given x alone, a Hugging Face model returns .logits and no loss: the default loss is their cross-entropy
    against the pair's y, as for a model that returns a tensor (it was refused as returning no logits)."""
    pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")
    import torch
    from harness.checkout.datasets import DataInfo
    from harness.checkout.models import build_model, loss_fn
    from harness.training import TrainConfig
    from harness.training.checks import check
    from harness.training.losses import default_loss
    from tests.helpers.data_files import make_token_files
    make_token_files(tmp_path / "tok", vocab=64)
    options = {"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 16, "n_positions": 16, "vocab_size": 64}
    config = TrainConfig(model="hf-causal-lm", model_options=options, dataset="tokens", data_dir=str(tmp_path / "tok"),
                         dataset_options={"block_size": 8, "vocab_size": 64}, batch_size=2, save=None)
    check(config)           # rank 0's fit check, in this process: one batch through the model and the loss
    model = build_model("hf-causal-lm", DataInfo("tokens", (8,), 64), **options)
    x, y = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
    output = model(x)
    assert output.loss is None
    assert torch.equal(default_loss(output, (x, y)), loss_fn(output.logits, y))


def test_a_dataset_drawn_at_random_is_the_same_on_every_rank_and_each_time_it_is_opened(tmp_path):
    """Rank 0 opens the data for its checks, then again to train: every opening draws from generators seeded by
    --seed and the split, so no rank trains on other samples than its peers (numpy is reseeded in each worker)."""
    run_train(tmp_path, "--dataset", f"{USER}:drawn", "--data-dir", str(tmp_path), "--max-steps", "2", name="drawn")
    draws = [line.split() for line in (tmp_path / "draws").read_text().splitlines()]
    train = [(pid, total) for split, pid, total in draws if split == "train"]
    val = {total for split, _, total in draws if split == "val"}
    assert len(train) == 3 and len({pid for pid, _ in train}) >= 2       # rank 0's check and both ranks' training
    assert len({total for _, total in train}) == 1 and len(val) == 1 and val != {train[0][1]}


@pytest.mark.parametrize("loss, said", [("nowhere.module:fn", "cannot import module 'nowhere.module'"),
                                        (f"{USER}:nothing", f"module '{USER}' has no callable 'nothing'")])
def test_a_loss_that_cannot_be_imported_is_one_line(loss, said, tmp_path, monkeypatch, capsys):
    """A module that cannot be found is the parent's line (found, not imported: no torch there); a name it does not
    hold, rank 0's (harness/training/checks.py)."""
    line = train_error("--loss", loss, "--log-dir", str(tmp_path), monkeypatch=monkeypatch, capsys=capsys)
    assert line.startswith("Train.py: error: --loss: ") and said in line, line


def test_a_huggingface_gpt2_from_its_config_trains_on_a_datasets_dataset(tmp_path, capsys):
    pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")
    pytest.importorskip("datasets", reason="Hugging Face datasets is not installed (pip install -e '.[hf]')")
    options = '{"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 16}'
    results, save = run_train(tmp_path, "--model", "hf-causal-lm", "--model-options", options, "--dataset",
                              f"{USER}:hf_tokens", "--optimizer", "adamw", "--lr", "3e-3", "--batch-size", "16",
                              "--epochs", "4", name="hf")
    assert len({r["checksum"] for r in results}) == 1
    epochs = epochs_of(tmp_path, "hf")
    assert epochs[-1]["val_loss"] < 0.5 * epochs[0]["val_loss"], [e["val_loss"] for e in epochs]
    capsys.readouterr()
    assert Test.main(["--checkpoint", str(save), "--json"]) == 0        # in this process: transformers is imported
    tested = capsys.readouterr().out
    assert '"accuracy": null' in tested and '"loss": ' in tested
