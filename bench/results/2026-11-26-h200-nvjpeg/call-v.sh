#!/bin/bash
# Device call V (one GPU): the GPU tests of the input pipeline and the default graph after the nvjpeg decoder's removal.
set -u
cd "$(dirname "$0")/.."
git log -1 --format=%H > $OUT/commit.txt 2>/dev/null
timeout -k 5 300 python -m pytest -m gpu -v -p no:cacheprovider --timeout 200 tests/test_pipeline_gpu.py \
  "tests/test_train_gpu.py::test_the_default_cuda_graph_trains_exactly_as_eager_steps" > $OUT/gpu_tests.log 2>&1
echo "rc=$?" >> $OUT/gpu_tests.log
tail -4 $OUT/gpu_tests.log
