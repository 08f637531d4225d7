"""Input that cannot train is refused before any worker starts, in one line that names the flags and
the fix: a model and a dataset that do not fit each other (one real batch goes through the model and
the loss in the parent), numbers that make no sense, and the papercuts a newcomer meets first."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy
import pytest
import torch

import Train
from harness.launch.launchers import read_hostfile
from harness.training import ConfigError, TrainConfig, run
from harness.checkout.datasets import DataInfo
from harness.checkout.datasets.custom import infer_info
from harness.training.checks import check
from harness.training.config import TYPES
from tests.helpers import user_code
from tests.helpers.data_files import make_image_folder, make_token_files
from tests.helpers.training import cli, run_train, train_error

MODELS = ["mlp", "cnn", "gpt", "oddeven", "resnet18"]
TINY_GPT = {"n_layer": 1, "n_head": 2, "n_embd": 16}


def datasets(tokens_dir) -> dict[str, dict]:
    """Every kind of built-in data, small."""
    return {"digits": {}, "oddeven": {}, "synthetic images": {"dataset": "synthetic", "dataset_options": {"size": 64}},
            "synthetic tokens": {"dataset": "synthetic", "dataset_options": {"size": 64, "tokens": True}},
            "tokens": {"dataset": "tokens", "data_dir": str(tokens_dir), "dataset_options": {"block_size": 32}}}


@pytest.fixture(scope="module")
def tokens_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokens")
    make_token_files(root)
    return root


@pytest.mark.parametrize("model", MODELS)
def test_every_builtin_model_with_every_builtin_dataset_fits_or_is_one_line_naming_both(model, tokens_dir):
    fitted = []
    for name, options in datasets(tokens_dir).items():
        config = TrainConfig(model=model, batch_size=2, save=None, **{"dataset": name, **options},
                             model_options=TINY_GPT if model == "gpt" else {})
        try:
            check(config)
            fitted.append(name)
        except ConfigError as e:
            assert len(str(e).splitlines()) == 1 and f"--model {model}" in str(e) and "--dataset" in str(e), str(e)
    kinds = {"mlp": {"digits", "oddeven", "synthetic images"}, "cnn": {"digits", "synthetic images"},
             "gpt": {"synthetic tokens", "tokens"}, "oddeven": {"digits", "oddeven", "synthetic images"},
             "resnet18": {"digits", "synthetic images"}}
    assert set(fitted) == kinds[model]


def test_token_data_with_the_default_model_is_refused_in_one_line(tokens_dir, monkeypatch, capsys):
    line = train_error("--dataset", "tokens", "--data-dir", str(tokens_dir), "--dataset-options", '{"block_size": 32}',
                       monkeypatch=monkeypatch, capsys=capsys)
    assert "--model mlp does not fit --dataset tokens" in line and "int64 [2, 32]" in line


def test_a_model_that_returns_a_tuple_without_a_loss_is_refused_naming_what_it_returns(tmp_path, monkeypatch, capsys):
    (tmp_path / "tuple_model.py").write_text(
        "import torch\n"
        "class M(torch.nn.Linear):\n"
        "    def forward(self, x):\n"
        "        out = super().forward(x.flatten(1))\n"
        "        return out, out\n"
        "def make(info):\n"
        "    return M(64, info.num_classes)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    line = train_error("--model", "tuple_model:make", monkeypatch=monkeypatch, capsys=capsys)
    assert "--model tuple_model:make does not fit --dataset digits: it returns a tuple, not a tensor of logits" in line


def test_a_model_factory_that_raises_is_named_as_a_failed_check_with_its_traceback(tmp_path, monkeypatch, capsys):
    (tmp_path / "broken_model.py").write_text("def make(info):\n    return info.no_such_field\n")
    monkeypatch.syspath_prepend(str(tmp_path))             # the children get this process's sys.path
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    status = Train.main(["--model", "broken_model:make", "--save", str(tmp_path / "m.pt"),
                         "--log-dir", str(tmp_path / "logs")])
    err = capsys.readouterr().err
    assert status == 1 and err.startswith("Train.py: checking the inputs failed: child 0 raised AttributeError: "), err
    assert 'broken_model.py", line 2, in make' in err and not (tmp_path / "m.pt").exists()


@pytest.mark.parametrize("fast_limit, devices", [(10**6, ["meta", "cpu"]), (10, ["meta"])])
def test_a_model_over_the_fast_limit_that_fits_is_never_built_on_the_parents_cpu(fast_limit, devices, monkeypatch):
    """Building GPT-2 on the parent's CPU held the workers' first step back by seconds: over fit.FAST_LIMIT the
    batch runs on the meta device, and a model that passes there is not built again (the parent's one meta
    build checks the model's options and runs the batch)."""
    monkeypatch.setattr(user_code, "BUILT", [])
    monkeypatch.setattr("harness.training.fit.FAST_LIMIT", fast_limit)
    check(TrainConfig(model="tests.helpers.user_code:noted", batch_size=2, save=None))
    assert user_code.BUILT == devices


@pytest.mark.parametrize("fast_limit, real_limit", [(10**6, 10**9), (10, 10**9), (10, 10)],
                         ids=["real weights", "meta device, then real weights", "meta device only"])
def test_a_model_with_fewer_classes_than_the_data_is_refused_in_one_line_wherever_its_batch_runs(
        fast_limit, real_limit, monkeypatch):
    """Cross-entropy refuses a target beyond the logits on real weights; on the meta device, which reads no
    value, fit.targets_beyond does, also for a model too large to build on the parent's CPU."""
    monkeypatch.setattr("harness.training.fit.FAST_LIMIT", fast_limit)
    monkeypatch.setattr("harness.training.fit.REAL_LIMIT", real_limit)
    with pytest.raises(ConfigError) as refused:
        check(TrainConfig(model="tests.helpers.user_code:five_classes", batch_size=2, save=None))
    line = str(refused.value)
    assert len(line.splitlines()) == 1 and "--model tests.helpers.user_code:five_classes does not fit --dataset digits" in line
    assert "Target 9 is out of bounds" in line


@pytest.mark.parametrize("fast_limit", [10**6, 10], ids=["real weights", "meta device"])
def test_a_model_that_returns_its_own_loss_is_not_held_to_its_logits_classes(fast_limit, monkeypatch):
    """Its loss is its own, not cross-entropy against the pair's targets: 5 outputs on 10-class data pass."""
    monkeypatch.setattr("harness.training.fit.FAST_LIMIT", fast_limit)
    check(TrainConfig(model="tests.helpers.user_code:five_with_own_loss", batch_size=2, save=None))


@pytest.mark.parametrize("real_limit", [10**9, 10], ids=["confirmed on real weights", "left to the workers"])
def test_a_model_the_meta_device_cannot_run_is_not_refused_for_it(real_limit, monkeypatch):
    """Hugging Face's GPT-2 calls .item() in its forward, which the meta device cannot answer: that is not the
    model failing to fit its data. Real weights decide where the model is small enough to build on the parent's
    CPU; above fit.REAL_LIMIT the workers do."""
    pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")
    monkeypatch.setattr("harness.training.fit.FAST_LIMIT", 10)
    monkeypatch.setattr("harness.training.fit.REAL_LIMIT", real_limit)
    options = {"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 16}
    check(TrainConfig(model="hf-causal-lm", model_options=options, dataset="tests.helpers.user_code:hf_tokens",
                      batch_size=2, save=None))


@pytest.mark.parametrize("given, said", [
    ({"max_steps": "5"}, "TrainConfig max_steps='5' is str, not int or None"),
    ({"batch_size": 8.0}, "TrainConfig batch_size=8.0 is float, not int"),
    ({"gpus": 1}, "TrainConfig gpus=1 is int, not str or None"),
    ({"epochs": True}, "TrainConfig epochs=True is bool, not int"),
    ({"model_options": '{"hidden": [32]}'}, "TrainConfig model_options='{\"hidden\": [32]}' is str, not dict (the "
                                            "options themselves, not their JSON text)"),
    ({"gpus": [0, 1]}, "TrainConfig gpus=[0, 1] is list, not str or None (the GPUs as one string: '0,1')"),
    ({"save": Path("m.pt")}, "TrainConfig save=PosixPath('m.pt') is PosixPath, not str or None (pass str(path))"),
    ({"batch_size": numpy.int64(16)}, "TrainConfig batch_size=np.int64(16) is int64, not int (pass int(value))"),
    ({"model": len}, "TrainConfig model=<built-in function len> is builtin_function_or_method, not str (name a "
                     "factory as 'package.module:factory', a function in a module file the workers import, not "
                     "the object itself)"),
    # choices that only Train.py's argparse checked: off the list, a value fell through to another behaviour
    ({"mode": "Grad"}, "TrainConfig mode='Grad' is not one of --mode's choices: grad, param, async (did you mean "
                       "'grad'?)"),
    ({"heal": "no"}, "TrainConfig heal='no' is not one of --heal's choices: on, off"),
    ({"lr_schedule": "cosin"}, "TrainConfig lr_schedule='cosin' is not one of --lr-schedule's choices: constant, "
                               "cosine, linear, step (did you mean 'cosine'?)")])
def test_a_config_built_in_python_with_a_value_of_another_type_or_off_its_choices_is_one_line_before_anything_starts(
        given, said):
    assert {name.strip() for f in dataclasses.fields(TrainConfig) for name in f.type.split("|")} <= set(TYPES)
    TrainConfig(lr=1).check_types()         # an int where a float is due is a number all the same
    with pytest.raises(ConfigError) as refused:
        run(TrainConfig(**given))
    assert str(refused.value) == said


def test_a_config_field_that_does_not_exist_is_refused_with_the_closest_one():
    """Python's own TypeError ("unexpected keyword argument") named no field that exists."""
    for make in (lambda: TrainConfig(lr_schedul="cosine"), lambda: TrainConfig().replace(epoch=3)):
        with pytest.raises(ConfigError) as refused:
            make()
        assert str(refused.value).startswith("TrainConfig has no field ")
    assert "'epoch' (did you mean 'epochs'?); its fields are Train.py's flags" in str(refused.value)
    with pytest.raises(ConfigError, match="has no field 'zebra_stripes'; its fields"):
        TrainConfig(zebra_stripes=True)


def test_max_steps_given_with_epochs_says_which_one_ends_the_run(capsys):
    assert Train.parse_args(["--epochs", "3", "--max-steps", "5"]).max_steps == 5
    assert "note: --max-steps 5 overrides --epochs 3: the run ends after 5 updates" in capsys.readouterr().err
    Train.parse_args(["--max-steps", "5"])
    Train.parse_args(["--epochs", "3"])
    assert "note" not in capsys.readouterr().err


def test_a_model_option_of_the_wrong_kind_names_the_flags_it_came_from(monkeypatch, capsys):
    line = train_error("--model-options", '{"hidden": 32}', monkeypatch=monkeypatch, capsys=capsys)
    assert line.startswith("Train.py: error: --model mlp --model-options '{\"hidden\": 32}': "), line


def test_float64_samples_are_named_as_the_data_s_to_fix_not_the_model_s():
    with pytest.raises(ConfigError) as refused:
        check(TrainConfig(model="mlp", dataset="tests.helpers.user_code:doubles", batch_size=2, save=None))
    assert str(refused.value).startswith("--dataset tests.helpers.user_code:doubles gives float64 samples, which "
                                         "--model mlp's float32 weights do not take")
    assert "make them float32" in str(refused.value)


def test_a_model_factory_the_meta_device_cannot_build_is_checked_on_real_weights():
    """A factory that reads a value as it builds (``.item()``, ``from_pretrained``) fails on the meta device: that is
    not its fault, and it must not be refused for it."""
    check(TrainConfig(model="tests.helpers.user_code:reads_a_value", batch_size=2, save=None))


def test_a_regression_needs_no_class_count_and_a_built_in_model_gets_one_output_for_it():
    assert infer_info(user_code.Regression("train"), "regression") == DataInfo("vector", (8,), 1)
    check(TrainConfig(model="mlp", dataset="tests.helpers.user_code:regression", loss="tests.helpers.user_code:mse",
                      batch_size=2, save=None))


def test_what_a_plain_dataset_s_samples_are_is_read_off_them():
    tensors = torch.utils.data.TensorDataset
    labels = torch.tensor([0, 2, 1, 2])
    assert infer_info(tensors(torch.zeros(4, 5), labels), "plain") == DataInfo("vector", (5,), 3)   # labels 0..2
    assert infer_info(tensors(torch.zeros(4, 7, 5), labels), "lstm").kind == "sequence"
    assert infer_info(tensors(torch.zeros(4, 2, 3, 8, 8), labels), "video").kind == "tensor"
    val = tensors(torch.zeros(2, 5), torch.tensor([3, 0]))                      # a label only validation has
    assert infer_info(tensors(torch.zeros(4, 5), labels), "plain", val).num_classes == 4
    with pytest.raises(ValueError, match=r"its targets are floats \(tensor\(1\.\)\) but it names 2 classes; class labels "
                                         r"are integers \(y\.long\(\), int\(y\)\)"):
        infer_info(user_code.FloatLabels(), "float labels")


@pytest.mark.parametrize("spec, guess", [
    ("tests.helpers.user_code.mse", " (did you mean 'tests.helpers.user_code:mse'?)"),
    ("tests.helpers.user_code:", ""), ("user_code", "")])
def test_a_loss_named_without_a_colon_before_its_function_says_so(spec, guess, monkeypatch, capsys):
    """It was imported as a module of that dotted name and refused with advice about PYTHONPATH."""
    line = train_error("--loss", spec, monkeypatch=monkeypatch, capsys=capsys)
    assert line.endswith(f"'{spec}' names no function: give 'package.module:function', a colon before the function's "
                         f"name{guess}")


@pytest.mark.parametrize("loss, said", [
    ("mse_of_the_output_alone", "mse_of_the_output_alone() takes 1 positional argument but 2 were given"),
    ("mse_as_a_float", "it returned a float, not a 0-d tensor"),
    ("mse_per_sample", "it returned a tensor of shape [2], not a 0-d tensor (reduce it: .mean())")])
def test_a_loss_that_does_not_take_the_model_s_output_is_named_rather_than_the_model(loss, said):
    config = TrainConfig(model="tests.helpers.user_code:linear", dataset="tests.helpers.user_code:regression",
                         loss=f"tests.helpers.user_code:{loss}", batch_size=2, save=None)
    with pytest.raises(ConfigError) as refused:
        check(config)
    assert str(refused.value).startswith(f"--loss tests.helpers.user_code:{loss} does not take the output of --model "
                                         f"tests.helpers.user_code:linear: {said} (a batch of x float32 [2, 8], y float32 [2])")
    assert "called as fn(output, batch)" in str(refused.value)


@pytest.mark.parametrize("flags, message", [
    (["--lr", "inf"], "--lr must be positive and finite, got inf"),
    (["--lr", "nan"], "--lr must be positive and finite, got nan"),
    (["--lr", "1e6"], "--lr 1000000.0 is far above any learning rate that trains"),
    (["--min-lr", "nan"], "--min-lr nan must be between 0 and --lr"),
    (["--momentum", "1.5"], "--momentum must be in [0, 1), got 1.5"),
    (["--weight-decay", "nan"], "--weight-decay must be in [0, 1], got nan"),
    (["--clip-grad", "inf"], "--clip-grad must be a positive norm, got inf"),
    (["--bucket-mb", "nan"], "--bucket-mb must be positive and finite, got nan"),
    (["--heartbeat-timeout", "inf"], "--heartbeat-timeout must be a positive number of seconds, got inf"),
    (["--target-error", "2"], "--target-error must be a fraction in [0, 1], got 2.0"),
    (["--val-fraction", "nan"], "--val-fraction must be in [0, 1), got nan"),
    (["--model-options", '{"hidden": [NaN]}'], "--model-options hidden=[nan] must be a finite number"),
    (["--model", "gpt", "--dataset", "synthetic", "--dataset-options", '{"tokens": true}', "--model-options",
      '{"dropout": 1.5}'], "gpt dropout=1.5 must be in [0, 1)"),
])
def test_numbers_that_make_no_sense_are_refused_in_one_line(flags, message, monkeypatch, capsys):
    assert message in train_error(*flags, monkeypatch=monkeypatch, capsys=capsys)


@pytest.mark.parametrize("flags, message", [
    (["--mode", "param", "--reduce-dtype", "bf16", "--bucket-mb", "5"],
     "--bucket-mb 5.0, --reduce-dtype bf16 set how --mode grad averages gradients, which --mode param does not do"),
    (["--mode", "async", "--grad-sync", "flat"], "--grad-sync flat sets how --mode grad averages gradients"),
    (["--avg-every", "4"], "--avg-every 4 sets how often --mode param (or async) syncs; add --mode param or drop it"),
    (["--min-lr", "0.001"], "--min-lr 0.001 is where a --lr-schedule ends, and the constant rate has none"),
    (["--profile-updates", "3"], "--profile-updates 3 sets what --profile records; add --profile DIR or drop it"),
    (["--val-fraction", "0", "--patience", "3"], "--patience 3 sets when to stop on validation, and --dataset "
                                                  "digits has no validation split in this run"),
    (["--dataset", "synthetic", "--val-fraction", "0", "--target-error", "0.1"],
     "--target-error 0.1 sets when to stop on validation, and --dataset synthetic has no validation split"),
    (["--save", "", "--save-every-steps", "5"], "--save-every-steps 5 sets how often --save writes, and this run "
                                                "saves nothing (--save ''); give --save a path or drop it"),
    (["--cuda-graph", "--no-tf32"], "--cuda-graph, --no-tf32 set how GPU workers run, and this run's workers are on "
                                    "the CPU; drop them (or pass --gpus)"),
    (["--log-dir", ""], "--log-dir '' names no folder, and every run writes its log; give one (default runs)"),
])
def test_a_flag_that_would_change_nothing_in_the_run_is_refused_in_one_line(flags, message, monkeypatch, capsys):
    assert message in train_error(*flags, monkeypatch=monkeypatch, capsys=capsys)


def test_data_flags_that_the_data_does_not_read_are_refused_in_one_line(tokens_dir, tmp_path, monkeypatch, capsys):
    images = make_image_folder(tmp_path / "images", per_class=2)
    cases = [(["--data-dir", str(tmp_path)], f"--data-dir {tmp_path}: --dataset digits reads no folder"),
             (["--dataset", "synthetic", "--data-dir", str(tmp_path)], "--dataset synthetic reads no folder"),
             (["--dataset", "tokens", "--data-dir", str(tokens_dir), "--val-fraction", "0.2"],
              f"--val-fraction 0.2 holds part of the training set out for validation, and --dataset tokens validates "
              f"on {tokens_dir}/val.bin instead; drop --val-fraction"),
             (["--dataset", "tests.helpers.user_code:windows", "--val-fraction", "0"], "validates on its factory's 'val' split (none where it returns None)"),
             (["--dataset", "imagefolder", "--data-dir", str(images), "--val-fraction", "0.3"], f"on {images}/val/")]
    for flags, message in cases:
        assert message in train_error(*flags, monkeypatch=monkeypatch, capsys=capsys)
    (images / "val").rename(tmp_path / "elsewhere")           # without val/, the fraction carves train/: taken
    config = TrainConfig(dataset="imagefolder", data_dir=str(images), val_fraction=0.5, batch_size=1, save=None,
                         model="cnn", dataset_options={"crop": 16, "resize": 20})
    assert check(config)[1].samples == 3         # of 6: half held out


@pytest.mark.parametrize("flags, message", [
    (["--model", "tests.helpers.user_code:frozen"], "--model tests.helpers.user_code:frozen: the loss depends on no "
     "parameter that trains, so training would change nothing: none of the model's parameters requires grad"),
    (["--loss", "tests.helpers.user_code:detached_loss"], "--loss tests.helpers.user_code:detached_loss depends on no "
     "parameter that trains, so training would change nothing: the loss does not require grad; make it from the "
     "model's output without .detach() or torch.no_grad()"),
    (["--model", "tests.helpers.batchnorm_model:model", "--batch-size", "1"], "--batch-size 1: --model "
     "tests.helpers.batchnorm_model:model normalises over the batch (BatchNorm), which one sample cannot train"),
    (["--model", "tests.helpers.user_code:not_a_module"],
     "--model tests.helpers.user_code:not_a_module: the factory returned a str, not a torch.nn.Module"),
    (["--model", "tests.helpers.user_code:no_parameters"], "--model tests.helpers.user_code:no_parameters: the loss "
     "depends on no parameter that trains, so training would change nothing: the model has no parameters at all"),
    (["--model", "tests.helpers.user_code:takes_nothing"], "--model tests.helpers.user_code:takes_nothing cannot be "
     "called as factory(info, **options): too many positional arguments"),
    (["--dataset", "tests.helpers.user_code:takes_nothing"], "--dataset tests.helpers.user_code:takes_nothing cannot "
     "be called as factory(split, data_dir, **options): too many positional arguments"),
    (["--dataset", "tests.helpers.user_code:regression", "--dataset-options", '{"size": 3}'], "--dataset "
     "tests.helpers.user_code:regression cannot be called as factory(split, data_dir, **options): got an unexpected "
     "keyword argument 'size'"),
    (["--model", "tests.helpers.user_code:widened", "--model-options", '{"widht": 8}'], "--model "
     "tests.helpers.user_code:widened cannot be called as factory(info, **options): got an unexpected keyword "
     "argument 'widht' (did you mean 'width'?)"),
    (["--dataset", "tests.helpers.user_code:varying_lengths"], "--dataset tests.helpers.user_code:varying_lengths: its "
     "samples differ in shape, so they do not stack into a batch (stack expects each tensor to be equal size"),
    (["--dataset", "tests.helpers.user_code:one_hot"], "its targets are floats, and the default loss is cross-entropy "
     "over class indices: give class indices (.long(); y.argmax(-1) of one-hot rows), or pass --loss"),
    (["--model", "tests.helpers.user_code:linear", "--dataset", "tests.helpers.user_code:regression"],
     "or pass --loss package.module:fn for a regression"),
    (["--dataset", "tests.helpers.user_code:int_one_hot"], "its targets look like one-hot rows, and the default loss "
     "takes class indices: give y.argmax(-1)"),
    (["--dataset", "tests.helpers.user_code:int32_labels"], "its targets are int32, and the default loss takes int64 "
     "class indices: give y.long() (torch.from_numpy(y).long())"),
    (["--model", "tests.helpers.user_code:linear", "--dataset", "tests.helpers.user_code:unformatted"], "the batch "
     "holds lists, not tensors: give tensors (a Hugging Face datasets.Dataset does after .set_format(\"torch\")"),
])
def test_a_model_and_loss_that_would_train_nothing_or_fail_in_the_workers_are_refused_in_one_line(
        flags, message, monkeypatch, capsys):
    assert message in train_error(*flags, "--save", "", monkeypatch=monkeypatch, capsys=capsys)


@pytest.mark.parametrize("flags", [["--lr", "-1"], ["--model", "tests.helpers.user_code:not_a_module"]],
                         ids=["by-the-parent", "by-rank-0"])
def test_a_refused_run_leaves_no_folder_behind(flags, tmp_path, monkeypatch, capsys):
    """The checkpoint's folder is probed (by the parent and by rank 0) and the lock taken only once the checks
    passed, so neither the folders nor the lock files stay where a refused run pointed."""
    out = tmp_path / "out"
    train_error(*flags, "--save", str(out / "checkpoints" / "model.pt"), "--log-dir", str(out / "runs"),
                monkeypatch=monkeypatch, capsys=capsys)
    assert list(tmp_path.iterdir()) == []


def test_a_save_path_ending_in_a_slash_and_a_data_dir_that_is_a_file_are_refused(tmp_path, monkeypatch, capsys):
    """``--save ck/`` wrote a file named ck; a token file given as --data-dir was looked for inside itself."""
    line = train_error("--save", f"{tmp_path / 'ck'}/", "--log-dir", str(tmp_path / "logs"), monkeypatch=monkeypatch,
                       capsys=capsys)
    assert line == f"Train.py: error: --save {tmp_path / 'ck'}/ is a folder; give a file path inside it, e.g. " \
                   f"{tmp_path / 'ck' / 'model.pt'}"
    (tmp_path / "train.bin").write_bytes(b"\0" * 64)
    line = train_error("--dataset", "tokens", "--data-dir", str(tmp_path / "train.bin"), "--save", "",
                       monkeypatch=monkeypatch, capsys=capsys)
    assert line == (f"Train.py: error: --data-dir {tmp_path / 'train.bin'} is a file; --dataset tokens reads a "
                    f"folder: give the one that holds its files ({tmp_path})")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.bin"]


@pytest.mark.parametrize("dataset, options, message", [
    ("digits", '{"size": 100}', "--dataset-options: --dataset digits has no option 'size'; it takes none"),
    ("synthetic", '{"sizes": 64}', "--dataset-options: --dataset synthetic has no option 'sizes' (did you mean "
     "'size'?); its options: shape, num_classes, size, tokens, seq_len, vocab_size"),
])
def test_an_option_a_built_in_dataset_does_not_take_is_named_with_the_ones_it_does(dataset, options, message,
                                                                                    monkeypatch, capsys):
    line = train_error("--dataset", dataset, "--dataset-options", options, "--save", "", monkeypatch=monkeypatch,
                       capsys=capsys)
    assert line == f"Train.py: error: {message}"


def test_a_log_dir_that_is_a_file_is_refused(tmp_path, monkeypatch, capsys):
    (tmp_path / "notes.md").write_text("x")
    line = train_error("--log-dir", str(tmp_path / "notes.md"), monkeypatch=monkeypatch, capsys=capsys)
    assert f"--log-dir {tmp_path / 'notes.md'} is a file, not a folder" in line


def test_a_hostfile_line_that_is_not_a_host_is_refused_with_its_number(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=2\n# a comment\nnode2 slots=abc\n")
    with pytest.raises(ValueError, match=r"line 3: 'node2 slots=abc' is not"):
        read_hostfile(str(hostfile))
    result = cli("Train.py", "--launcher", "ssh", "--hostfile", str(hostfile))
    assert result.returncode == 2 and "line 3" in result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("script, flags, line", [
    ("Train.py", ["--modle", "mlp"], "Train.py: error: unrecognized arguments: --modle mlp (did you mean '--model'?); "
                                     "see Train.py --help"),
    ("Train.py", ["--lrr=0.1"], "Train.py: error: unrecognized arguments: --lrr=0.1 (did you mean '--lr'?); "
                                "see Train.py --help"),
    ("Train.py", ["--optimizer", "Adamw"], "Train.py: error: argument --optimizer: invalid choice: 'Adamw' (choose "
                                           "from 'sgd', 'adam', 'adamw', 'adagrad', 'adadelta', 'ccnesterov') (did "
                                           "you mean 'adamw'?); see Train.py --help"),
    ("Train.py", ["--dataset", "digit"], "Train.py: error: unknown dataset 'digit' (did you mean 'digits'?); valid "
                                         "names: cifar10, digits, imagefolder, mnist, oddeven, synthetic, tokens, or "
                                         "package.module:factory"),
    ("Test.py", ["--chekpoint", "m.pt"], "Test.py: error: unrecognized arguments: --chekpoint m.pt (did you mean "
                                         "'--checkpoint'?); see Test.py --help")])
def test_a_mistyped_flag_or_name_is_one_line_naming_the_closest(script, flags, line, tmp_path):
    """argparse's usage block (36 lines for Train.py) is left out: the line names the flag or name meant."""
    result = cli(script, *flags, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.strip() == line, result.stderr


@pytest.mark.parametrize("script, flag", [("Train.py", "--work"), ("Test.py", "--check")])
def test_abbreviated_flags_are_not_taken_for_longer_ones(script, flag, tmp_path):
    result = cli(script, flag, "1", cwd=tmp_path)
    assert result.returncode == 2 and f"unrecognized arguments: {flag} 1" in result.stderr


def test_test_py_names_a_model_module_it_cannot_import_and_how_to_fix_it(tmp_path, monkeypatch):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "my_model.py").write_text(
        "import torch\ndef make(info):\n    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mine"))        # trained in this process: children get its sys.path
    _, save = run_train(tmp_path, "--model", "my_model:make", "--epochs", "1", name="m")
    tested = cli("Test.py", "--checkpoint", str(save), cwd=tmp_path)
    lines = tested.stderr.strip().splitlines()
    assert tested.returncode == 2 and len(lines) == 1, tested.stderr
    assert "module 'my_model', which cannot be imported here" in lines[0] and "PYTHONPATH" in lines[0]
    assert "run from the folder that holds it" in lines[0]
    assert cli("Test.py", "--checkpoint", str(save), "--json", env={"PYTHONPATH": str(tmp_path / "mine")}).returncode == 0
    assert cli("Test.py", "--checkpoint", str(save), "--json", cwd=tmp_path / "mine").returncode == 0     # as it says


def test_train_py_finds_a_model_module_in_the_folder_it_runs_in_and_says_how_when_it_cannot(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "my_model.py").write_text(
        "import torch\ndef make(info):\n    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))\n")
    flags = ("--model", "my_model:make", "--max-steps", "2", "--save", "", "--log-dir", str(tmp_path / "logs"))
    elsewhere = cli("Train.py", *flags, cwd=tmp_path)
    assert elsewhere.returncode == 2
    assert elsewhere.stderr.strip().splitlines()[-1] == (
        "Train.py: error: cannot import module 'my_model' for model 'my_model:make': No module named 'my_model'; run "
        "from the folder that holds it, or add that folder to PYTHONPATH (PYTHONPATH=/path/to/folder python ...)")
    trained = cli("Train.py", *flags, cwd=tmp_path / "mine")
    assert trained.returncode == 0, trained.stderr


@pytest.mark.parametrize("in_flight", [True, False])
def test_a_resume_with_other_fragments_is_refused_while_exchanges_of_the_saved_ones_are_in_flight(in_flight):
    """Streaming DiLoCo's checkpoint holds the exchanges in flight by fragment: another --fragments would apply them
    to other slices (it failed mid-run with an IndexError)."""
    from harness.training.checks import _check_resumable
    run = dict(mode="param", outer_optimizer="nesterov", avg_every=8, max_steps=40, samples=1000, workers=2)
    saved = {"config": TrainConfig(**run, fragments=2, outer_delay=2).to_dict(), "step": 20, "epoch": 1,
             "position": 0, "ranks": [{"pending": [(1, 18, 20, None, 64)] if in_flight else []}] * 2}
    resumed = TrainConfig(**run, fragments=1, resume="m.pt")
    if not in_flight:
        _check_resumable(resumed, saved)
        return
    with pytest.raises(ConfigError, match=r"was trained with --fragments 2; drop .* \(exchanges of its fragments were "
                                          r"in flight when it saved\)"):
        _check_resumable(resumed, saved)


def test_a_resume_that_changes_mode_to_or_from_grad_drops_the_saved_mode_s_synchronisation_flags(tmp_path):
    """DiLoCo resumed in grad mode: the saved --outer-optimizer and --avg-every were refused as flags the user should
    drop, which they never passed. Between param and async, which share them, they are kept."""
    _, save = run_train(tmp_path, "--mode", "param", "--avg-every", "4", "--outer-optimizer", "nesterov",
                        "--max-steps", "4")
    graded = TrainConfig.resuming(str(save), mode="grad", max_steps=8)
    assert (graded.outer_optimizer, graded.avg_every) == ("average", 1)
    check(graded)                                       # refused before: "--outer-optimizer sets what --mode param..."
    served = TrainConfig.resuming(str(save), mode="async", max_steps=8)
    assert (served.outer_optimizer, served.avg_every) == ("nesterov", 4)
    told = TrainConfig.resuming(str(save), mode="grad", max_steps=8, avg_every=2)
    assert told.avg_every == 2                          # given: kept, and refused by the checks as before
    with pytest.raises(ConfigError, match="--avg-every 2 sets how often --mode param"):
        check(told)


def test_the_fields_a_change_of_mode_resets_are_train_py_s_synchronisation_flags():
    from harness.training.config import SYNCHRONISATION
    from harness.training.flags import make_parser
    [group] = [g for g in make_parser("")._action_groups if g.title == "synchronisation"]
    assert sorted(SYNCHRONISATION) == sorted(action.dest for action in group._group_actions if action.dest != "mode")
