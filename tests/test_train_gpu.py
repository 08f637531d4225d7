"""Train.py on GPU workers (NCCL): replicas identical in grad mode, averaged in param mode; the
default CUDA graph trains exactly as eager steps do; accumulated micro-batches equal the whole batch."""
import pytest
import torch

import Train
from harness.training import run
from tests.helpers.gpus import has_gpus
from tests.helpers.training import flat_params, run_train

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("flags", [["--mode", "grad"], ["--mode", "param"], ["--mode", "grad", "--no-cuda-graph"],
                                   ["--mode", "grad", "--grad-sync", "flat", "--amp", "bf16"]])
def test_training_on_two_gpus_keeps_replicas_in_step(tmp_path, capfd, flags):
    if not has_gpus(2):
        pytest.skip("needs 2 CUDA GPUs")
    every = ["--avg-every", "4"] if "param" in flags else []
    args = Train.parse_args(["--gpus", "0,1", "--epochs", "3", *every, *flags,
                             "--save", str(tmp_path / "m.pt"), "--log-dir", str(tmp_path)])
    results = run(args)
    assert len({r["checksum"] for r in results}) == 1
    assert results[0]["step"] == 3 * (1293 // 2 // 32)
    assert "running eagerly" not in capfd.readouterr().out      # the default graph really captured


@pytest.mark.parametrize("flags", [["--optimizer", "sgd"], ["--optimizer", "adamw", "--amp", "bf16"]])
def test_the_default_cuda_graph_trains_exactly_as_eager_steps(tmp_path, capfd, flags):
    if not has_gpus(2):
        pytest.skip("needs 2 CUDA GPUs")
    common = ["--gpus", "0,1", "--max-steps", "50", "--no-tf32", "--lr", "0.01", *flags]
    run_train(tmp_path, *common, "--no-cuda-graph", name="eager")
    run_train(tmp_path, *common, name="graph")
    assert "running eagerly" not in capfd.readouterr().out
    eager, graphed = flat_params(tmp_path / "eager.pt"), flat_params(tmp_path / "graph.pt")
    assert torch.allclose(eager, graphed, rtol=0, atol=1e-6), (eager - graphed).abs().max()


@pytest.mark.parametrize("flags", [[], ["--no-cuda-graph"], ["--compile"]])
def test_two_gpus_accumulating_two_micro_batches_equal_one_gpu_with_the_whole_batch(tmp_path, capfd, flags):
    """--grad-accum on GPU workers: graphed (the whole update, both micro-batches, in one graph), eager,
    and compiled, with a bucket per parameter so that the hooks and no_sync are exercised."""
    if not has_gpus(2):
        pytest.skip("needs 2 CUDA GPUs")
    common = ["--max-steps", "40", "--no-tf32", "--lr", "0.05", "--seed", "2"]
    run_train(tmp_path, *common, "--gpus", "0", "--batch-size", "64", name="one")
    run_train(tmp_path, *common, "--gpus", "0,1", "--batch-size", "16", "--grad-accum", "2", "--bucket-mb", "0.001",
              *flags, name="accumulated")
    if not flags:
        assert "running eagerly" not in capfd.readouterr().out
    one, accumulated = flat_params(tmp_path / "one.pt"), flat_params(tmp_path / "accumulated.pt")
    assert (one - accumulated).norm() <= 1e-5 * one.norm(), (one - accumulated).abs().max()


@pytest.mark.parametrize("flags", [["--compile"], ["--lr-schedule", "cosine", "--warmup-steps", "10"],
                                   ["--compile", "--optimizer", "adamw", "--amp", "bf16", "--lr-schedule", "cosine",
                                    "--warmup-steps", "10", "--clip-grad", "1.0", "--grad-accum", "2"]])
def test_compiled_and_scheduled_steps_are_graphed_and_train_as_eager_ones(tmp_path, capfd, flags):
    """torch.compile and the whole-step CUDA graph together, and a schedule read from the device: the
    graph replays what the eager step computes (the learning rate a device tensor the fused optimizer reads)."""
    if not has_gpus(1):
        pytest.skip("needs a CUDA GPU")
    common = ["--gpus", "0", "--max-steps", "40", "--no-tf32", "--lr", "0.01", "--batch-size", "16", *flags]
    run_train(tmp_path, *common, "--no-cuda-graph", name="eager")
    capfd.readouterr()
    run_train(tmp_path, *common, name="graph")
    assert "running eagerly" not in capfd.readouterr().out
    eager, graphed = flat_params(tmp_path / "eager.pt"), flat_params(tmp_path / "graph.pt")
    tolerance = 2e-2 if "bf16" in flags else 1e-5
    assert (eager - graphed).norm() <= tolerance * eager.norm(), (eager - graphed).abs().max()


@pytest.mark.parametrize("flags", [["--amp", "bf16"], ["--amp", "fp16", "--compile"]])
def test_dict_batches_into_a_model_with_its_own_loss_are_graphed_and_train_as_eager_ones(tmp_path, capfd, flags):
    """A Hugging Face GPT-2 from its config, called as model(**batch) on {"input_ids", "labels"} batches
    of one shape, trained on its own .loss: the whole step captured (fp16: the loss scaler's found-inf
    check and the skip inside the graph), the same parameters as eager steps."""
    if not has_gpus(1):
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("transformers", reason="needs transformers (pip install -e '.[hf]')")
    common = ["--gpus", "0", "--max-steps", "30", "--no-tf32", "--lr", "0.001", "--batch-size", "8",
              "--optimizer", "adamw", "--model", "hf-causal-lm", "--model-options",
              '{"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 64, "n_positions": 16}',
              "--dataset", "tests.helpers.user_code:windows", *flags]
    run_train(tmp_path, *common, "--no-cuda-graph", name="eager")
    capfd.readouterr()
    run_train(tmp_path, *common, name="graph")
    assert "running eagerly" not in capfd.readouterr().out
    eager, graphed = flat_params(tmp_path / "eager.pt"), flat_params(tmp_path / "graph.pt")
    assert (eager - graphed).norm() <= 2e-2 * eager.norm(), (eager - graphed).abs().max()


@pytest.mark.parametrize("flags", [["--zero", "1"], ["--zero", "2"], ["--zero", "2", "--compile", "--amp", "fp16"]])
def test_sharded_steps_are_graphed_and_train_as_replicated_eager_ones(tmp_path, capfd, flags):
    """--zero's reduce-scatter, sharded update and all-gather inside the whole-step CUDA graph (NCCL in a
    world of one: every bucket one piece), with several buckets (hooks), clipping and accumulation,
    against the unsharded eager step."""
    if not has_gpus(1):
        pytest.skip("needs a CUDA GPU")
    common = ["--gpus", "0", "--max-steps", "30", "--no-tf32", "--optimizer", "adamw", "--lr", "0.001",
              "--clip-grad", "0.5", "--grad-accum", "2", "--bucket-mb", "0.05"]
    run_train(tmp_path, *common, *flags[2:], "--no-cuda-graph", name="replicated")
    run_train(tmp_path, *common, *flags, name="sharded")
    assert "running eagerly" not in capfd.readouterr().out
    replicated, sharded = flat_params(tmp_path / "replicated.pt"), flat_params(tmp_path / "sharded.pt")
    tolerance = 2e-2 if "--amp" in flags else 1e-6
    assert (replicated - sharded).norm() <= tolerance * replicated.norm(), (replicated - sharded).abs().max()


@pytest.mark.parametrize("zero", ["1", "2"])
def test_two_gpus_overlapping_the_all_gather_with_the_graphed_forward_train_as_replicas(tmp_path, capfd, zero):
    """--zero on 2 GPUs, graphed: each update's all-gather runs on NCCL's side stream while the next forward
    waits for each bucket where it first reads it (harness/collectives/prefetch.py); a wait too late reads
    the other rank's half of the update before, and the run parts from the replicated graphed one. Odd layer
    widths make buckets that 2 ranks do not divide (padded: gathered through the staging slot)."""
    if not has_gpus(2):
        pytest.skip("needs 2 CUDA GPUs")
    common = ["--gpus", "0,1", "--max-steps", "30", "--no-tf32", "--optimizer", "adamw", "--lr", "0.001",
              "--clip-grad", "0.5", "--grad-accum", "2", "--bucket-mb", "0.05", "--model-options", '{"hidden": [511, 509]}']
    run_train(tmp_path, *common, name="replicated")
    run_train(tmp_path, *common, "--zero", zero, name="sharded")
    assert "running eagerly" not in capfd.readouterr().out
    replicated, sharded = flat_params(tmp_path / "replicated.pt"), flat_params(tmp_path / "sharded.pt")
    assert (replicated - sharded).norm() <= 1e-6 * replicated.norm(), (replicated - sharded).abs().max()
