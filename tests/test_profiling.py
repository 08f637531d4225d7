"""--profile: a torch.profiler record of a few updates, and the summary that says where their time went."""
from __future__ import annotations

import json

import pytest

from harness.training.profiling import _union_us, categorize, pools
from tests.helpers.training import run_train, train_error


@pytest.mark.parametrize("kernel, category", [
    ("triton_poi_fused_convolution_backward_native_batch_norm_12", "fused elementwise/reduction"),
    ("triton_tem_fused_mm_3", "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float>", "normalization"),
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", "matmul"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>", "attention"),
    ("void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*, unsigned int)", "attention"),
    ("void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*, void const*)", "attention"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdam>", "optimizer"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "communication"),
    ("Memcpy HtoD (Pinned -> Device)", "copy"),
    ("some_kernel_nobody_knows", "other"),
])
def test_kernels_fall_in_their_category(kernel, category):
    assert categorize(kernel) == category


def test_busy_time_counts_overlapping_kernels_once():
    assert _union_us([(0, 10), (5, 15), (20, 30), (21, 22)]) == 25


def test_memory_is_grouped_by_pool_and_stream():
    mb = 2**20
    snapshot = {"segments": [
        {"segment_pool_id": (0, 0), "stream": 0, "total_size": 40 * mb, "allocated_size": 30 * mb,
         "blocks": [{"size": 30 * mb, "state": "active_allocated"}, {"size": 10 * mb, "state": "inactive"}]},
        {"segment_pool_id": (0, 0), "stream": 0, "total_size": 2 * mb, "allocated_size": 0, "blocks": []},
        {"segment_pool_id": (0, 7), "stream": 5, "total_size": 100 * mb, "allocated_size": 100 * mb,
         "blocks": [{"size": 60 * mb, "state": "active_allocated"}, {"size": 40 * mb, "state": "active_allocated"}]},
    ]}
    summary = pools(snapshot, largest=2)
    assert list(summary["by_pool"]) == ["private [0, 7] pool, stream 5", "default pool, stream 0"]
    assert summary["by_pool"]["default pool, stream 0"] == {"reserved_mb": 42.0, "allocated_mb": 30.0, "segments": 2}
    assert summary["largest_blocks"] == [{"mb": 60.0, "pool": "private [0, 7] pool, stream 5"},
                                         {"mb": 40.0, "pool": "private [0, 7] pool, stream 5"}]


def test_a_cpu_run_records_the_updates_asked_for(tmp_path):
    run_train(tmp_path, "--cpu-workers", "2", "--max-steps", "8", "--batch-size", "16",
              "--profile", str(tmp_path / "profile"), "--profile-from", "3", "--profile-updates", "4")
    summary = json.loads((tmp_path / "profile" / "profile.json").read_text())
    assert summary["updates"] == 4 and summary["wall_ms"] > 0
    assert summary["kernel_ms"] == {} and summary["top"] == []      # CPU workers: no device kernels
    assert "memory" not in summary
    trace = json.loads((tmp_path / "profile" / "trace.json").read_text())
    assert any("backward" in event.get("name", "") for event in trace["traceEvents"])
    assert "Self CPU" in (tmp_path / "profile" / "profile.txt").read_text()


def test_a_window_past_the_run_is_refused(monkeypatch, capsys, tmp_path):
    error = train_error("--max-steps", "10", "--profile", str(tmp_path / "p"), monkeypatch=monkeypatch, capsys=capsys)
    assert "--profile records updates 21 to 25, after --max-steps 10" in error
