"""Train.py on GPU workers (NCCL): replicas identical in grad mode, averaged in param mode."""
import pytest

import Train
from conftest import has_gpus

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("flags", [["--mode", "grad"], ["--mode", "param"], ["--mode", "grad", "--cuda-graph"],
                                   ["--mode", "grad", "--grad-sync", "flat", "--amp", "bf16"]])
def test_training_on_two_gpus_keeps_replicas_in_step(tmp_path, capfd, flags):
    if not has_gpus(2):
        pytest.skip("needs 2 CUDA GPUs")
    args = Train.parse_args(["--gpus", "0,1", "--epochs", "3", "--avg-every", "4", *flags,
                             "--save", str(tmp_path / "m.pt"), "--log-dir", str(tmp_path)])
    results = Train.train(*Train.make_config(args))
    assert len({r["checksum"] for r in results}) == 1
    assert results[0]["step"] == 3 * (1293 // 2 // 32)
    assert "running eagerly" not in capfd.readouterr().out      # --cuda-graph really captured
