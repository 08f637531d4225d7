"""The slow-link bench's pure parts (scripts/bench/slow_link.py): what it reads from a run's records and
output, how rows of several invocations make one table, the text its token file is made of. The bench
itself needs root and minutes."""
from __future__ import annotations

from scripts.bench.slow_link import (committed_text, format_table, merge_rows, outer_sync_figures, refusal,
                                     time_to_target, val_curve, validation_interval, variant_flags, with_targets)


def test_the_curve_is_validation_losses_in_seconds_since_launch_and_the_target_is_met_at_the_first_at_or_below():
    records = [{"event": "step", "time": 101.0, "loss": 9.0},
               {"event": "validation", "time": 110.0, "step": 10, "val_loss": 3.0},
               {"event": "validation", "time": 120.0, "step": 20, "val_loss": 2.5},
               {"event": "validation", "time": 130.0, "step": 30, "val_loss": 2.6}]
    curve = val_curve(records, launched=100.0)
    assert curve == [[10.0, 3.0], [20.0, 2.5], [30.0, 2.6]]
    assert time_to_target(curve, 2.5) == 20.0
    assert time_to_target(curve, 3.5) == 10.0
    assert time_to_target(curve, 2.4) is None
    assert time_to_target(curve, None) is None


def test_targets_come_from_the_unthrottled_grad_row_and_apply_to_every_row():
    rows = [{"variant": "grad", "throttled": True, "final_val_loss": 1.0, "val_curve": [[5.0, 1.0]]},
            {"variant": "grad", "throttled": False, "final_val_loss": 2.0, "val_curve": [[50.0, 2.1], [90.0, 2.0]]},
            {"variant": "diloco", "throttled": False, "final_val_loss": 1.9, "val_curve": [[9.0, 2.1], [12.0, 2.03]]},
            {"variant": "async", "throttled": False, "error": "Train.py: error: argument --mode"}]
    target, timed = with_targets(rows)
    assert target == 2.04
    assert [r["time_to_target_s"] for r in timed] == [5.0, 90.0, 12.0, None]
    assert with_targets(rows[2:])[0] is None


def test_an_async_row_is_timed_to_the_final_loss_of_diloco_with_the_same_throttling():
    rows = [{"variant": "diloco", "throttled": True, "final_val_loss": 2.67, "wall_s": 25.0, "val_curve": [[25.0, 2.67]]},
            {"variant": "diloco", "throttled": False, "final_val_loss": 2.60, "wall_s": 20.0, "val_curve": []},
            {"variant": "async", "throttled": True, "val_curve": [[10.0, 3.0], [20.0, 2.66], [22.0, 2.6]]},
            {"variant": "async", "throttled": False, "val_curve": [[10.0, 3.0], [20.0, 2.66]]}]
    timed = with_targets(rows)[1]
    assert [(r.get("time_to_diloco_s"), r.get("x_diloco_wall")) for r in timed] == \
        [(None, None), (None, None), (20.0, 0.8), (None, None)]        # the unthrottled one never got to 2.60
    compressed = [{**rows[0], "variant": "diloco-bf16", "final_val_loss": 2.9, "wall_s": 40.0}, *rows[:3],
                  {**rows[2], "variant": "async-bf16"}]
    assert [r.get("x_diloco_wall") for r in with_targets(compressed)[1]] == [None, None, None, 0.8, 0.5]  # 20 / 40


def test_outer_syncs_give_the_blocked_share_of_wall_time_and_the_largest_staleness():
    records = [{"event": "outer_sync", "blocked_s": 1.5, "staleness": 0},
               {"event": "outer_sync", "blocked_s": 0.5, "staleness": 1},
               {"event": "step", "loss": 2.0}]
    assert outer_sync_figures(records, wall_s=20.0) == (0.1, 1)
    both = [{**r, "rank": rank} for r, rank in zip(records[:2], (0, 1))] + [{**records[0], "rank": 1}]
    assert outer_sync_figures(both, wall_s=20.0) == (0.0875, 1)        # (1.5 + 0.5 + 1.5) / 2 workers / 20 s
    assert outer_sync_figures([{"event": "step", "loss": 2.0}], wall_s=20.0) == (None, None)


def test_a_refusal_is_the_last_line_train_py_printed():
    output = "usage: Train.py [-h] ...\nTrain.py: error: argument --mode: invalid choice: 'async'\n\n"
    assert refusal(output) == "Train.py: error: argument --mode: invalid choice: 'async'"
    assert refusal("") == "no output"


def test_rows_run_again_replace_their_earlier_selves_in_place():
    old = [{"variant": "grad", "throttled": False, "n": 1}, {"variant": "diloco", "throttled": False, "n": 1}]
    new = [{"variant": "diloco", "throttled": False, "n": 2}, {"variant": "diloco", "throttled": True, "n": 2}]
    assert [(r["variant"], r["throttled"], r["n"]) for r in merge_rows(old, new)] == [
        ("grad", False, 1), ("diloco", False, 2), ("diloco", True, 2)]


def test_parameter_averaging_validates_at_its_syncs_only_and_the_variants_differ_in_their_sync_flags():
    assert validation_interval("param-average", 10, 50) == 50
    assert validation_interval("param-average", 60, 50) == 100
    assert validation_interval("diloco", 10, 50) == 10
    assert variant_flags("diloco-bf16", 50)[-2:] == ["--outer-dtype", "bf16"]
    assert variant_flags("async", 50)[:4] == ["--mode", "async", "--max-staleness", "1"]
    assert variant_flags("async", 50, 10)[-2:] == ["--outer-delay", "10"] and "--outer-delay" not in variant_flags("async", 50)
    assert "--avg-every" in variant_flags("streaming", 50) and "--fragments" in variant_flags("streaming", 50)


def test_the_table_shows_figures_and_errors():
    rows = [{"variant": "grad", "throttled": False, "samples": 6400, "final_val_loss": 2.5, "wall_s": 180.0,
             "time_to_target_s": 170.0, "bytes_sent": 760e6, "blocked_frac": None, "max_staleness_seen": None},
            {"variant": "async", "throttled": True, "samples": 6400, "error": "Train.py: error: no async"}]
    table = format_table(rows).splitlines()
    assert table[1].split() == ["grad", "False", "6400", "2.5000", "180.0", "170.0", "760.00", "-", "-", "-"]
    assert table[2].endswith("error: Train.py: error: no async")


def test_the_token_text_is_a_commits_py_and_md_files_in_path_order():
    names, text = committed_text("HEAD")
    assert names == sorted(names) and all(name.endswith((".py", ".md")) for name in names)
    assert "Train.py" in names and b"import argparse" in text
