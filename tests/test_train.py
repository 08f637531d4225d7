"""Train.py and Test.py end to end on CPU workers and small data."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

import Test
import Train
from harness.training import ConfigError, TrainConfig, run
from harness.resilience.checkpoint import load_checkpoint
from harness.training.metrics import curves, read_metrics
from tests.helpers.training import ROOT, cli, flat_params, run_test_py, run_train, train_error


def test_train_then_test_end_to_end_from_another_directory_beside_a_huggingface_style_datasets_package(
        tmp_path, capsys):
    """The two commands, run from a directory other than the checkout's with a package called
    ``datasets`` (as Hugging Face's is) first on the path: the harness's own datasets/ is used all the same."""
    save, logs = tmp_path / "model.pt", tmp_path / "logs"
    fake = tmp_path / "site" / "datasets"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('this is the Hugging Face datasets package')\n")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])}
    trained = cli("Train.py", "--plot", "--epochs", "6", "--save", str(save), "--log-dir", str(logs), env=env,
                  cwd=elsewhere)
    assert trained.returncode == 0, trained.stderr
    assert "Epoch 6/6: average loss per sample" in trained.stdout + trained.stderr
    records = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["event"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2, 3, 4, 5, 6]
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    assert (logs / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tested = cli("Test.py", "--checkpoint", str(save), env=env, cwd=elsewhere)
    assert tested.returncode == 0, tested.stderr
    accuracy = float(next(l for l in tested.stdout.splitlines() if l.startswith("accuracy: ")).split()[1])
    assert accuracy > 0.85
    assert "confusion matrix" in tested.stdout
    # Test.py's evaluation on workers, in this process (the command line itself is tested just above)
    assert Test.main(["--checkpoint", str(save), "--cpu-workers", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["accuracy"] == pytest.approx(accuracy) and result["samples"] == 360


@pytest.mark.parametrize("every", [[], ["--validate-every", "3"]], ids=["at-the-end", "every-3"])
def test_a_run_that_ends_within_its_first_epoch_says_its_validations_and_plots_them_per_update(every, tmp_path, capsys):
    """The digits' epoch is 20 updates on 2 workers: 6 end within it, where no epoch's line reports anything."""
    logs = tmp_path / "logs"
    assert Train.main(["--max-steps", "6", *every, "--save", "", "--log-dir", str(logs)]) == 0
    said = capsys.readouterr()
    lines = re.findall(r"^Update (\d+): validation error \d+\.\d\d%$", said.out + said.err, re.MULTILINE)
    assert lines == (["3", "6"] if every else ["6"])
    assert "Epoch " not in said.out + said.err
    assert (logs / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_grad_mode_replicas_stay_identical(tmp_path):
    results, _ = run_train(tmp_path, "--epochs", "3", "--cpu-workers", "3", "--batch-size", "16")
    checksums = [r["checksum"] for r in results]
    assert len(set(checksums)) == 1 and results[0]["step"] == 3 * (1293 // 3 // 16)


def test_param_mode_averages_replicas(tmp_path):
    results, save = run_train(tmp_path, "--epochs", "2", "--mode", "param", "--avg-every", "4",
                              "--avg-optimizer-state", "--optimizer", "adam", "--lr", "0.003")
    assert len({r["checksum"] for r in results}) == 1
    assert load_checkpoint(save)["config"]["mode"] == "param"


def test_resume_continues_exactly(tmp_path):
    common = ["--epochs", "4", "--seed", "5", "--nesterov"]
    run_train(tmp_path, *common, name="straight")
    run_train(tmp_path, *common[:1], "2", *common[2:], name="half")
    state = load_checkpoint(tmp_path / "half.pt")
    assert (state["epoch"], state["step"]) == (2, 40)
    save = tmp_path / "resumed.pt"
    args = Train.parse_args([*common, "--resume", str(tmp_path / "half.pt"), "--save", str(save),
                             "--log-dir", str(tmp_path / "resumed")])
    run(args)
    assert torch.equal(flat_params(tmp_path / "straight.pt"), flat_params(save))
    assert load_checkpoint(save)["step"] == load_checkpoint(tmp_path / "straight.pt")["step"] == 80


def test_a_config_made_in_python_continues_a_saved_run_only_as_resuming_makes_it(tmp_path):
    """TrainConfig(resume=PATH) would train with its own defaults (lr, batch size, schedule), not the saved run's, as
    it did silently: it is refused, naming TrainConfig.resuming, which --resume uses."""
    _, half = run_train(tmp_path, "--max-steps", "3", "--lr", "0.01", "--batch-size", "16", name="half")
    with pytest.raises(ConfigError, match=r"make it with TrainConfig\.resuming\("):
        run(TrainConfig(resume=str(half), max_steps=6))
    resumed = TrainConfig.resuming(str(half), max_steps=6)
    assert (resumed.lr, resumed.batch_size, resumed.inherited) == (0.01, 16, True)
    assert "inherited" not in load_checkpoint(half)["config"]


@pytest.mark.parametrize("classes", [3, 30])
def test_test_py_says_n_a_for_a_class_without_samples_and_leaves_a_vocabulary_s_classes_to_json(classes, capsys):
    from harness.training.evaluation import report, summarize
    confusion = torch.zeros(classes, classes, dtype=torch.long)
    confusion[0, 0], confusion[1, 1], confusion[1, 0] = 2, 1, 1        # no sample of class 2 and up
    state = {"config": {"model": "mlp", "dataset": "digits", "data_dir": None}, "epoch": 1, "step": 2}
    result = summarize(state, {"confusion": confusion, "loss_sum": 4.0, "samples": 4}, [])
    assert result["per_class_accuracy"] == [1.0, 0.5] + [None] * (classes - 2)
    report(result, as_json=False)
    shown = capsys.readouterr().out
    if classes == 3:
        assert "per-class accuracy: 0: 1.000, 1: 0.500, 2: n/a" in shown and "confusion matrix" in shown
    else:
        assert "per-class accuracy and confusion matrix: 30 classes, in --json" in shown and "0: 1.000" not in shown


def test_an_epoch_resumed_mid_epoch_reports_the_loss_of_all_its_updates(tmp_path):
    run_train(tmp_path, "--epochs", "1", name="straight")
    _, stopped = run_train(tmp_path, "--max-steps", "7", name="stopped")
    assert load_checkpoint(stopped)["epoch_so_far"][1] == 2 * 7         # both workers' updates so far
    run(Train.parse_args(["--max-steps", "20", "--resume", str(stopped), "--save", str(tmp_path / "resumed.pt"),
                          "--log-dir", str(tmp_path / "resumed")]))
    epochs = {name: [r for r in read_metrics(tmp_path / name / "metrics.jsonl") if r["event"] == "epoch"]
              for name in ("straight", "resumed")}
    assert [r["step"] for r in epochs["resumed"]] == [r["step"] for r in epochs["straight"]] == [20]
    assert epochs["resumed"][0]["train_loss"] == pytest.approx(epochs["straight"][0]["train_loss"], rel=1e-12)


def test_a_fresh_run_in_the_folder_of_an_earlier_one_plots_itself_and_says_it_replaces_the_checkpoint(tmp_path,
                                                                                                        capsys):
    flags = ["--save", str(tmp_path / "model.pt"), "--log-dir", str(tmp_path / "runs")]
    run(Train.parse_args([*flags, "--epochs", "3"]))
    assert "holds an earlier run" not in capsys.readouterr().out
    run(Train.parse_args([*flags, "--epochs", "1", "--lr", "0.001"]))
    assert f"{tmp_path / 'model.pt'} holds an earlier run: this run replaces it" in capsys.readouterr().out
    records = read_metrics(tmp_path / "runs" / "metrics.jsonl")
    assert [r["resume"] for r in records if r["event"] == "run"] == [None, None]
    assert curves(records).x_name == "epoch" and curves(records).loss[0] == [1]       # the second run's one epoch
    assert curves(records).lr[1] == [0.001]
    assert Train.main([*flags, "--epochs", "1", "--cuda-graph"]) == 2           # refused: it leaves no trace
    assert "holds an earlier run" not in capsys.readouterr().out
    assert read_metrics(tmp_path / "runs" / "metrics.jsonl") == records


def test_target_error_stops_early(tmp_path):
    _, save = run_train(tmp_path, "--epochs", "50", "--target-error", "0.2", "--validate-every", "10")
    assert load_checkpoint(save)["epoch"] < 50


@pytest.mark.parametrize("flags, message", [
    (["--model", "transformerx"], "unknown model 'transformerx'; valid names: cnn, gpt, hf-causal-lm, mlp"),
    (["--dataset", "imagenet"], "unknown dataset 'imagenet' (did you mean 'imagefolder'?); valid names: cifar10, "
                                "digits"),
    (["--batch-size", "5000"], "larger than a worker's shard"),
    (["--gpus", "0,1"], "GPU 0 requested but 0 GPU"),
    (["--resume", "/nonexistent/model.pt"], "/nonexistent/model.pt"),
    (["--dataset", "mnist", "--data-dir", "/nonexistent"], "train-images-idx3-ubyte"),
    (["--model-options", "{bad json"], "not valid JSON"),
    (["--lr", "-1"], "--lr must be positive"),
    (["--heartbeat-timeout", "0"], "--heartbeat-timeout must be a positive"),
    (["--seed", "-1"], "--seed must not be negative"),
    (["--workers-per-gpu", "0"], "--workers-per-gpu must be at least 1"),
    (["--workers-per-gpu", "2"], "--workers-per-gpu 2 needs GPU workers"),
    (["--mps"], "--mps needs GPU workers"),
])
def test_bad_input_is_one_line_error_before_any_worker(flags, message, tmp_path, monkeypatch, capsys):
    line = train_error(*flags, "--save", str(tmp_path / "m.pt"), "--log-dir", str(tmp_path),
                       monkeypatch=monkeypatch, capsys=capsys)
    assert line.startswith("Train.py: error: ") and message in line
    assert not (tmp_path / "m.pt").exists()


def test_test_py_answers_help_and_bad_flags_without_importing_torch():
    """Test.py imports torch (3 s) only once its flags are good, as Train.py's parent never does."""
    code = ("import contextlib, io, json, sys, Test\n"
            "for flags in json.loads(sys.argv[1]):\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            "        try:\n"
            "            status = Test.main(flags)\n"
            "        except SystemExit as stop:\n"
            "            status = stop.code\n"
            "    print(status, 'torch' in sys.modules)")
    flags = [["--help"], ["--check", "1"], ["--batch-size", "0"]]
    done = subprocess.run([sys.executable, "-c", code, json.dumps(flags)], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.stdout.splitlines() == ["0 False", "2 False", "2 False"], done.stdout + done.stderr


def test_the_parent_checks_trains_saves_resumes_and_logs_without_importing_torch(tmp_path):
    """Train.py's parent only supervises: rank 0 checks the data, the model and --loss for it, the workers'
    exchanges (a checkpoint's generators, param mode's parts) pass through it sealed, --resume reads the checkpoint's
    config without torch (harness/resilience/saved_config.py) and --tensorboard writes with tensorboard's own
    writer. A bad input that rank 0 finds is one line all the same:
    test_bad_input_is_one_line_error_before_any_worker."""
    first = ["--epochs", "1", "--mode", "param", "--avg-every", "2", "--save", str(tmp_path / "a.pt"),
             "--log-dir", str(tmp_path / "a")]
    resumed = ["--epochs", "2", "--resume", str(tmp_path / "a.pt"), "--save", str(tmp_path / "b.pt"),
               "--log-dir", str(tmp_path / "b"), "--tensorboard"]
    user = "tests.helpers.user_code"        # a loss of one's own, which imports torch: rank 0 imports it
    own_loss = ["--model", f"{user}:linear", "--dataset", f"{user}:regression", "--loss", f"{user}:mse",
                "--max-steps", "2", "--save", "", "--log-dir", str(tmp_path / "c")]
    code = ("import json, sys, Train; statuses = [Train.main(flags) for flags in json.loads(sys.argv[1])]; "
            "print('torch in the parent' if 'torch' in sys.modules else 'no torch in the parent'); "
            "sys.exit(max(statuses))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps([first, resumed, own_loss])], capture_output=True,
                          text=True, timeout=240, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "no torch in the parent", done.stderr
    assert load_checkpoint(tmp_path / "a.pt")["epoch"] == 1
    resumed_state = load_checkpoint(tmp_path / "b.pt")
    assert resumed_state["epoch"] == 2 and resumed_state["config"]["mode"] == "param"
    assert list((tmp_path / "b").glob("events.out.tfevents.*"))
    assert [r["step"] for r in read_metrics(tmp_path / "c" / "metrics.jsonl") if r["event"] == "done"] == [2]
    [startup] = [r for r in read_metrics(tmp_path / "a" / "metrics.jsonl") if r["event"] == "startup"]
    parent, workers = startup["parent"], startup["workers"]      # the parent's checks overlap the workers' start
    assert parent["imported"] <= parent["forked"] < min(w["process"] for w in workers) <= parent["checked"]


def test_corrupt_checkpoint_and_unwritable_save_path(tmp_path):
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    for flags in (["--resume", str(corrupt)], ["--save", str(corrupt / "sub" / "m.pt")]):
        result = cli("Train.py", *flags, "--log-dir", str(tmp_path))
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and str(corrupt) in lines[0], result.stderr
    result = cli("Test.py", "--checkpoint", str(corrupt))
    assert result.returncode == 2 and str(corrupt) in result.stderr


@pytest.mark.parametrize("mode", ["grad", "async"])
def test_a_save_path_under_a_file_is_one_line_before_any_worker_starts(mode, tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    line = train_error("--mode", mode, "--save", str(blocker / "m.pt"), "--log-dir", str(tmp_path / "logs"),
                       monkeypatch=monkeypatch, capsys=capsys)
    assert f"checkpoint directory {blocker} cannot be created or written" in line


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    """One epoch of the default job, run once: (the workers' results, its checkpoint, its log folder)."""
    folder = tmp_path_factory.mktemp("one_epoch")
    results, save = run_train(folder, "--epochs", "1", name="timeline")
    return results, save, folder / "timeline"


def test_resume_refuses_a_checkpoint_of_another_configuration(one_epoch, tmp_path, monkeypatch, capsys):
    _, save, _ = one_epoch
    line = train_error("--resume", str(save), "--model-options", '{"hidden": [64]}', "--log-dir", str(tmp_path),
                       monkeypatch=monkeypatch, capsys=capsys)
    assert "--model-options {}" in line


def test_validation_split_smaller_than_the_worker_count(tmp_path):
    results, save = run_train(tmp_path, "--epochs", "1", "--cpu-workers", "3", "--val-fraction", "0.001")
    assert load_checkpoint(save)["epoch"] == 1 and len(results) == 3


@pytest.mark.parametrize("flags", [["--batch-size", "0"], ["--cpu-workers", "-1"]])
def test_test_py_rejects_bad_arguments(flags, capsys):
    status, _, err = run_test_py(capsys, *flags)
    assert status == 2 and "Test.py: error:" in err


def test_test_py_refuses_a_data_dir_that_the_checkpoint_s_dataset_does_not_read(one_epoch, capsys):
    _, save, _ = one_epoch
    status, _, err = run_test_py(capsys, "--checkpoint", str(save), "--data-dir", "/tmp")
    assert status == 2 and err.strip().splitlines() == [
        "Test.py: error: --data-dir /tmp: the checkpoint's --dataset digits reads no folder (it is bundled or "
        "generated); drop --data-dir"]


def test_a_model_that_builds_otherwise_than_its_checkpoint_is_one_line_for_test_py_and_for_resume(
        tmp_path, monkeypatch, capsys):
    """As when the model's file or options changed since it was trained (here: the saved options, rewritten)."""
    _, trained = run_train(tmp_path, "--max-steps", "5", "--model-options", '{"hidden": [32]}')
    state, save = load_checkpoint(trained), tmp_path / "edited.pt"       # mapped from its file: saved elsewhere
    state["config"]["model_options"] = {"hidden": [48]}
    torch.save(state, save)
    for workers in ("0", "2"):
        status, _, err = run_test_py(capsys, "--checkpoint", str(save), "--cpu-workers", workers)
        assert status == 2 and err.strip().splitlines() == [
            f"Test.py: error: {save}: the checkpoint does not fit --model mlp as it builds now: size mismatch for "
            "1.weight: copying a param with shape torch.Size([32, 64]) from checkpoint, the shape in current model is "
            "torch.Size([48, 64]). (and 2 more); it was trained with other model code or --model-options"]
    line = train_error("--resume", str(save), "--max-steps", "10", "--save", str(save), "--log-dir",
                       str(tmp_path / "again"), monkeypatch=monkeypatch, capsys=capsys)
    assert line.startswith(f"Train.py: error: --resume {save} does not fit --model mlp as it builds now: size "
                           "mismatch for 1.weight")


def test_a_checkpoint_whose_saved_flags_are_refused_now_still_resumes(tmp_path):
    """A run saved before a flag's value was refused (a --data-dir that digits does not read, a warm-up as long as
    the run) resumes: those are the saved run's values, not the user's."""
    _, trained = run_train(tmp_path, "--max-steps", "10", "--lr-schedule", "cosine", "--warmup-steps", "5")
    state, older = load_checkpoint(trained), tmp_path / "older.pt"
    state["config"].update(data_dir=str(tmp_path), warmup_steps=40)
    torch.save(state, older)
    run(Train.parse_args(["--resume", str(older), "--max-steps", "20", "--save", str(tmp_path / "resumed.pt"),
                          "--log-dir", str(tmp_path / "resumed")]))
    assert load_checkpoint(tmp_path / "resumed.pt")["step"] == 20


def test_test_py_from_another_folder_reads_the_data_from_the_trained_run_s_folder(tmp_path, monkeypatch, capsys):
    trained, elsewhere = tmp_path / "trained", tmp_path / "elsewhere"
    (trained / "data").mkdir(parents=True)
    elsewhere.mkdir()
    monkeypatch.chdir(trained)
    user = "tests.helpers.user_code"
    run(Train.parse_args(["--model", f"{user}:linear", "--dataset", f"{user}:loads", "--loss", f"{user}:mse",
                          "--data-dir", "data", "--max-steps", "3", "--save", "m.pt", "--log-dir", "logs"]))
    (trained / "data" / "val.pids").unlink()
    monkeypatch.chdir(elsewhere)
    status, _, err = run_test_py(capsys, "--checkpoint", str(trained / "m.pt"))
    assert status == 0, err
    assert (trained / "data" / "val.pids").read_text() and not (elsewhere / "data").exists()


def test_oddeven_prints_the_seeds_lines(tmp_path, capsys):
    _, save = run_train(tmp_path, "--model", "oddeven", "--dataset", "oddeven", "--epochs", "3")
    status, out, err = run_test_py(capsys, "--checkpoint", str(save))
    assert status == 0, err
    lines = [l for l in out.splitlines() if l.startswith("Input: ")]
    assert lines and all(re.fullmatch(r"Input: \d+, Prediction: [01]\.\d\d \(> 0\.5 => odd\)", l) for l in lines), lines


def test_startup_timeline_marks_every_phase_in_order(one_epoch):
    _, _, logs = one_epoch
    record = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()][-1]
    assert record["event"] == "startup" and len(record["workers"]) == 2
    assert list(record["parent"]) == ["process", "checked", "forked", "first_step"]
    for marks in record["workers"]:
        phases = ["process", "imported", "exec", "data", "model", "communicator", "first_step"]
        assert list(marks) == phases and all(marks[a] <= marks[b] for a, b in zip(phases, phases[1:]))
        # a worker is created after the parent's checks: its first mark on the same (wall) clock comes later
        # ("process" comes from /proc, in 10 ms ticks since boot: it is compared with the worker's own marks only)
        assert record["parent"]["checked"] <= marks["imported"] and marks["first_step"] <= record["time"]
    shown = subprocess.run([sys.executable, str(ROOT / "scripts" / "startup_timeline.py"), str(logs)],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "communicator" in shown.stdout and "rank 1" in shown.stdout


def test_data_of_other_classes_is_refused_by_test_py_and_by_a_resume(images, tmp_path, monkeypatch, capsys):
    """An image folder's labels are its class folders' names, sorted: with one renamed, every label means another
    class, and Test.py scored 0% with no word. The checkpoint keeps the names it trained on (config "classes")."""
    import shutil
    _, save = run_train(tmp_path, "--dataset", "imagefolder", "--data-dir", str(images), "--dataset-options",
                        '{"crop": 16, "resize": 20}', "--batch-size", "4", "--max-steps", "2")
    assert load_checkpoint(save)["config"]["classes"] == ["c0", "c1", "c2"]
    renamed = shutil.copytree(images, tmp_path / "renamed")
    for split in ("train", "val"):
        (renamed / split / "c0").rename(renamed / split / "z0")
    status, _, err = run_test_py(capsys, "--checkpoint", str(save), "--data-dir", str(renamed))
    assert status == 2 and err.strip() == (f"Test.py: error: {save}: the data's class 0 is 'c1', where it was trained "
                                           "on 'c0' (class folders renamed? their names, sorted, give the labels); "
                                           "test it on data of the classes it trained on"), err
    resumed = train_error("--resume", str(save), "--data-dir", str(renamed), "--max-steps", "4",
                          monkeypatch=monkeypatch, capsys=capsys)
    assert resumed.endswith("the data's class 0 is 'c1', where it was trained on 'c0' (class folders renamed? their "
                            "names, sorted, give the labels); resume it on the data it trained on"), resumed
    status, out, err = run_test_py(capsys, "--checkpoint", str(save))
    assert status == 0 and "accuracy" in out, err


def test_test_py_on_an_image_folder_trained_without_validation_says_how_to_give_it_a_test_split(images, tmp_path,
                                                                                              capsys):
    import shutil
    root = shutil.copytree(images / "train", tmp_path / "folder" / "train")
    _, save = run_train(tmp_path, "--dataset", "imagefolder", "--data-dir", str(root.parent), "--dataset-options",
                        '{"crop": 16, "resize": 20}', "--batch-size", "4", "--max-steps", "2", "--val-fraction", "0")
    status, _, err = run_test_py(capsys, "--checkpoint", str(save))
    assert status == 1 and err.strip() == (f"Test.py: evaluation failed: --dataset imagefolder has no test split in "
                                           f"{root.parent} (the run held none out: --val-fraction 0); add one "
                                           "(DIR/val/ for an image folder) and pass Test.py --data-dir DIR"), err
