# x2 call H5: NCCL's own log of every collective each rank enqueues (warm-up, capture), for the tiny GPT with many buckets,
# --zero 2 --heal on, graphed, that hangs (calls H3, H4): do the two ranks capture the same sequence?
cd "$(dirname "$0")/.."
python3 -m scripts.bench.make_data tokens /tmp/tok --train-gb 0.01 --val-mb 1 > /dev/null 2>&1
mkdir -p /tmp/h5/nccl
BASE=(--gpus 0,1 --model gpt --model-options '{"size":"tiny"}' --dataset tokens --data-dir /tmp/tok --dataset-options '{"block_size":1024}' --batch-size 8 --lr 6e-4 --optimizer adamw --heartbeat-timeout 10 --max-steps 60 --save-every-steps 20 --amp bf16 --clip-grad 1.0 --zero 2 --heal on --max-restarts 12 --bucket-mb 0.05)
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL,P2P NCCL_DEBUG_FILE=/tmp/h5/nccl/%h.%p.log setsid python3 Train.py "${BASE[@]}" --save /tmp/h5/s.pt --log-dir /tmp/h5/log > /tmp/h5/out.txt 2> /tmp/h5/err.txt &
pid=$!
for i in $(seq 1 35); do sleep 1; kill -0 $pid 2>/dev/null || break; done
kill -0 $pid 2>/dev/null && { echo "still running at 35 s" >> /tmp/h5/err.txt; kill -9 -- -$pid; sleep 2; }
wait $pid; echo "rc=$?" >> /tmp/h5/err.txt
ls -la /tmp/h5/nccl; wc -l /tmp/h5/nccl/*
tar czf $OUT/h5.tgz -C /tmp h5
