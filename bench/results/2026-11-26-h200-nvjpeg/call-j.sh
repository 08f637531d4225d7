#!/bin/bash
# Device call J (one GPU): JPEGs decoded on the GPU (nvjpeg, batched crop on the GPU) against simplejpeg in the loader
# processes, end to end in ResNet-50 training, beside the GPU-resident ceiling (issue 27, item 6).
set -u
cd "$(dirname "$0")/.."
(python -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)";
 nvidia-smi --query-gpu=name,memory.total --format=csv; nproc; git log -1 --format=%H; date -u +%FT%TZ) > $OUT/env.txt 2>&1
timeout -k 5 500 python -m scripts.bench.data --gpus 1 --parts resident jpeg --decoders nvjpeg simplejpeg \
  --images 10000 --resnet-steps 150 --data /tmp/bd --out /tmp/jo > $OUT/data.log 2>&1
echo "rc=$?" >> $OUT/data.log
tar czf $OUT/jo.tgz -C /tmp/jo .
tail -15 $OUT/data.log
