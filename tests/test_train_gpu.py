"""Train.py on GPU workers (NCCL): replicas identical in grad mode, averaged in param mode."""
import pytest

import Train
from conftest import has_gpus

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("mode", ["grad", "param"])
def test_training_on_two_gpus_keeps_replicas_in_step(tmp_path, mode):
    if not has_gpus(2):
        pytest.skip("needs 2 CUDA GPUs")
    args = Train.parse_args(["--gpus", "0,1", "--epochs", "3", "--mode", mode, "--avg-every", "4",
                             "--save", str(tmp_path / "m.pt"), "--log-dir", str(tmp_path)])
    results = Train.train(*Train.make_config(args))
    assert len({r["checksum"] for r in results}) == 1
    assert results[0]["step"] == 3 * (1293 // 2 // 32)
