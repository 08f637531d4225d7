"""The streamed input pipeline on GPUs: side-stream copies deliver exactly the CPU's batches, and
Train.py trains from a JPEG folder and a token file on GPU workers, resuming mid-epoch exactly."""
import pytest
import torch

import Train
from conftest import has_gpus
from data_files import make_image_folder, make_token_files
from harness.checkout.datasets import open_data
from harness.pipeline import StreamedBatches
from test_train import flat_params, run_train

pytestmark = pytest.mark.gpu


def test_side_stream_batches_equal_the_cpu_batches(tmp_path):
    if not has_gpus(1):
        pytest.skip("needs a CUDA GPU")
    dataset = open_data("imagefolder", str(make_image_folder(tmp_path, per_class=16)), crop=16, resize=20,
                        decoder="simplejpeg").train
    on_gpu = StreamedBatches(dataset, 0, 1, 8, seed=1, device=torch.device("cuda"), workers=2)
    on_cpu = StreamedBatches(dataset, 0, 1, 8, seed=1, device=torch.device("cpu"), workers=0)
    try:
        for epoch in range(2):
            pairs = list(zip(on_gpu.epoch(epoch), on_cpu.epoch(epoch)))
            assert len(pairs) == on_gpu.steps_per_epoch == 6
            for (xg, yg), (xc, yc) in pairs:
                assert xg.is_cuda and xg.is_contiguous(memory_format=torch.channels_last)
                torch.cuda.synchronize()
                assert torch.allclose(xg.cpu(), xc, atol=1e-5) and torch.equal(yg.cpu(), yc)
    finally:
        on_gpu.close()
        on_cpu.close()


def test_nvjpeg_decodes_on_the_gpu_what_pillow_decodes_on_the_cpu(tmp_path):
    if not has_gpus(1):
        pytest.skip("needs a CUDA GPU")
    dataset = open_data("imagefolder", str(make_image_folder(tmp_path, per_class=16)), crop=16, resize=20,
                        decoder="nvjpeg").train
    on_gpu = StreamedBatches(dataset, 0, 1, 8, seed=2, device=torch.device("cuda"), workers=2)
    on_cpu = StreamedBatches(dataset, 0, 1, 8, seed=2, device=torch.device("cpu"), workers=0)
    try:
        for (xg, yg), (xc, yc) in zip(on_gpu.epoch(1), on_cpu.epoch(1)):
            torch.cuda.synchronize()
            assert xg.shape == xc.shape == (8, 3, 16, 16) and torch.equal(yg.cpu(), yc)
            assert (xg.cpu() - xc).abs().mean() < 0.07          # ~4 of 255 levels: two JPEG decoders
    finally:
        on_gpu.close()
        on_cpu.close()


@pytest.mark.parametrize("kind", ["imagefolder", "tokens"])
def test_train_from_files_on_gpus_and_resume_mid_epoch(kind, tmp_path):
    gpus = "0,1" if has_gpus(2) else "0"
    if not has_gpus(1):
        pytest.skip("needs a CUDA GPU")
    if kind == "imagefolder":
        flags = ["--dataset", "imagefolder", "--data-dir", str(make_image_folder(tmp_path / "d", per_class=16)),
                 "--dataset-options", '{"crop": 16, "resize": 20}', "--model", "cnn", "--batch-size", "4"]
    else:
        flags = ["--dataset", "tokens", "--data-dir", str(make_token_files(tmp_path / "d")), "--dataset-options",
                 '{"block_size": 32, "vocab_size": 64}', "--model", "gpt", "--batch-size", "16"]
    flags += ["--gpus", gpus, "--no-tf32", "--data-workers", "2"]
    results, straight = run_train(tmp_path, *flags, "--max-steps", "9", name="straight")
    assert {r["step"] for r in results} == {9} and len({r["checksum"] for r in results}) == 1
    _, half = run_train(tmp_path, *flags, "--max-steps", "5", name="half")
    save = tmp_path / "resumed.pt"
    args = Train.parse_args([*flags, "--max-steps", "9", "--resume", str(half), "--save", str(save),
                             "--log-dir", str(tmp_path / "resumed")])
    Train.train(*Train.make_config(args))
    a, b = flat_params(straight), flat_params(save)
    assert (a - b).norm() <= 1e-5 * b.norm()
