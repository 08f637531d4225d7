import numpy as np
import pytest
import torch

from harness.training.config import TrainConfig
from harness.training.metrics import MetricsLog, curves, plot_metrics, read_metrics
from harness.training.progress import Lines, Progress

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def epoch_records() -> list[dict]:
    return [
        {"event": "start", "world_size": 2},
        {"event": "epoch", "epoch": 1, "train_loss": 2.0, "val_error": 0.6},
        {"event": "step", "step": 10, "loss": 1.5},
        {"event": "epoch", "epoch": 2, "train_loss": 1.2},
        {"event": "epoch", "epoch": 3, "train_loss": 0.8, "val_error": 0.3, "lr": 0.01},
    ]


def test_write_read_round_trip(tmp_path):
    log = MetricsLog(tmp_path / "logs")
    for record in epoch_records():
        log.write(record)
    assert read_metrics(log.path) == epoch_records()  # readable before close: every write is flushed
    log.close()
    assert log.path == tmp_path / "logs" / "metrics.jsonl"


def test_tensor_and_numpy_values_become_numbers(tmp_path):
    with MetricsLog(tmp_path) as log:
        log.write({"loss": torch.tensor(0.5), "acc": np.float32(0.25), "sizes": torch.tensor([1, 2])})
    assert read_metrics(log.path) == [{"loss": 0.5, "acc": 0.25, "sizes": [1, 2]}]


def test_unserialisable_value_names_type(tmp_path):
    with MetricsLog(tmp_path) as log, pytest.raises(TypeError, match="object"):
        log.write({"bad": object()})


def test_second_log_appends(tmp_path):
    with MetricsLog(tmp_path) as first:
        first.write({"event": "epoch", "epoch": 1, "train_loss": 1.0})
    with MetricsLog(tmp_path) as resumed:
        resumed.write({"event": "epoch", "epoch": 2, "train_loss": 0.5})
    assert [r["epoch"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]


def test_malformed_line_is_reported_with_line_number(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        read_metrics(path)


def test_plot_writes_png(tmp_path):
    png = plot_metrics(epoch_records(), tmp_path / "plots" / "metrics.png")
    assert png == tmp_path / "plots" / "metrics.png"
    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 1000
    assert int.from_bytes(data[20:24], "big") == 800       # three panels (8 in at 100 dpi): the rate has its own


def test_plot_without_anything_to_draw_returns_none(tmp_path):
    assert plot_metrics([{"event": "start"}, {"event": "saved", "step": 3}], tmp_path / "m.png") is None
    assert not (tmp_path / "m.png").exists()


def test_curves_are_per_epoch_once_an_epoch_ended_and_per_update_before():
    drawn = curves(epoch_records())
    assert (drawn.x_name, drawn.loss, drawn.validation, drawn.lr) == (
        "epoch", ([1, 2, 3], [2.0, 1.2, 0.8]), ([1, 3], [0.6, 0.3]), ([3], [0.01]))
    within_the_first = [{"event": "step", "step": 4, "loss": 2.1, "lr": 0.05},
                        {"event": "step", "step": 9, "loss": 1.7, "lr": 0.05},
                        {"event": "validation", "step": 10, "val_error": None, "val_loss": 1.4, "epoch_end": False}]
    drawn = curves(within_the_first)
    assert (drawn.x_name, drawn.loss, drawn.validation, drawn.validation_name) == (
        "update", ([4, 9], [2.1, 1.7]), ([10], [1.4]), "validation loss")


def test_curves_draw_the_last_fresh_run_and_the_runs_that_resumed_it():
    earlier = [{"event": "run", "resume": None},
               *({"event": "epoch", "epoch": e, "train_loss": 0.5 / e} for e in (1, 2, 3, 4))]
    fresh = [{"event": "run", "resume": None}, {"event": "epoch", "epoch": 1, "train_loss": 2.3}]
    resumed = [{"event": "run", "resume": "checkpoints/model.pt"}, {"event": "epoch", "epoch": 2, "train_loss": 2.0}]
    assert curves(earlier + fresh).loss == ([1], [2.3])
    assert curves(earlier + fresh + resumed).loss == ([1, 2], [2.3, 2.0])
    assert curves(earlier[1:]).loss == ([1, 2, 3, 4], [0.5, 0.25, 0.5 / 3, 0.125])     # a log from before "run"


@pytest.mark.parametrize("mode", ["grad", "async"])
def test_a_validation_is_said_once_on_the_epoch_s_line_or_in_async_mode_on_its_own(mode, tmp_path, capsys):
    """--mode async: the server has one worker validate when all workers' updates come due, not at rank 0's epochs."""
    measured = {"val_error": 0.25, "val_loss": 1.0}
    with MetricsLog(tmp_path) as log:
        progress = Progress(TrainConfig(mode=mode), 20, log)
        progress.handle({"event": "validation", "epoch": 0, "step": 20, "epoch_end": True, **measured})
        progress.handle({"event": "epoch", "epoch": 1, "step": 20, "train_loss": 2.0, "seconds": 0.5, "lr": 0.05,
                         **measured})
        progress.close()
    said = capsys.readouterr()
    lines = [line for line in (said.out + said.err).replace("\r", "\n").splitlines() if line[:6] in ("Epoch ", "Update")]
    assert lines == (["Update 20: validation error 25.00%", "Epoch 1/10: average loss per sample 2.0000 (0.5 s)"]
                     if mode == "async" else
                     ["Epoch 1/10: average loss per sample 2.0000, validation error 25.00% (0.5 s)"])


def test_off_a_terminal_progress_is_a_line_now_and_then_not_a_bar_redrawn_at_every_report(tmp_path, capsys):
    """A log file or a batch job's output (stderr here is pytest's capture, not a terminal): tqdm redrew its bar at
    every report and again after every epoch line, filling the file."""
    with MetricsLog(tmp_path) as log:
        progress = Progress(TrainConfig(), 20, log)
        for step in range(1, 41):
            progress.handle({"event": "step", "epoch": (step - 1) // 20, "step": step, "loss": 1.0 / step,
                             "samples_per_s": 100.0})
        progress.handle({"event": "epoch", "epoch": 2, "step": 40, "train_loss": 0.1, "seconds": 0.5, "lr": 0.05})
        progress.close()
    said = capsys.readouterr()
    assert "\r" not in said.err + said.out
    assert [line for line in said.err.splitlines() if line.startswith("update ")] == [
        "update 1/200: epoch 1/10, loss=1.0000, samples_s=100"]
    assert "Epoch 2/10: average loss per sample 0.1000 (0.5 s)" in said.out
    lines = Lines(200, 0, every=0)
    lines.update(3)
    lines.set_description("epoch 1/10")
    lines.set_postfix(loss="0.5000")
    assert capsys.readouterr().err == "update 3/200: epoch 1/10, loss=0.5000\n"
