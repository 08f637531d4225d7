"""The streamed input pipeline on GPUs: side-stream copies deliver exactly the CPU's batches, and
Train.py trains from a JPEG folder and a token file on GPU workers, resuming mid-epoch exactly."""
import pytest
import torch

from harness.checkout.datasets import open_data
from harness.data.pipeline import StreamedBatches
from tests.helpers.data_files import make_image_folder, make_token_files
from tests.helpers.gpus import has_gpus
from tests.helpers.training import stop_and_resume

pytestmark = pytest.mark.gpu


def test_side_stream_batches_equal_the_cpu_batches(tmp_path):
    """The same shard's batches through the GPU pipeline (loader processes, side stream) and on the CPU."""
    if not has_gpus(1):
        pytest.skip("needs a CUDA GPU")
    dataset = open_data("imagefolder", str(make_image_folder(tmp_path, per_class=16)), crop=16, resize=20).train
    on_gpu = StreamedBatches(dataset, 0, 1, 8, seed=1, device=torch.device("cuda"), workers=2)
    on_cpu = StreamedBatches(dataset, 0, 1, 8, seed=1, device=torch.device("cpu"), workers=0)
    try:
        pairs = [pair for epoch in range(2) for pair in zip(on_gpu.epoch(epoch), on_cpu.epoch(epoch))]
        torch.cuda.synchronize()
    finally:
        on_gpu.close()
        on_cpu.close()
    assert len(pairs) == 2 * 6
    for (xg, yg), (xc, yc) in pairs:
        assert xg.is_cuda and xg.is_contiguous(memory_format=torch.channels_last)
        assert torch.allclose(xg.cpu(), xc, atol=1e-5) and torch.equal(yg.cpu(), yc)


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
    straight, resumed, results, _ = stop_and_resume(tmp_path, flags, 5, 9)
    assert {r["step"] for r in results} == {9} and len({r["checksum"] for r in results}) == 1
    assert (straight - resumed).norm() <= 1e-5 * resumed.norm()
