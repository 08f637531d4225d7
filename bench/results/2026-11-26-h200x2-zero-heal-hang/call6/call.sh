# x2 call H6: the tiny GPT with many buckets, --zero 2 --heal on, graphed, hangs at its first replay (calls H3-H5; both ranks
# capture the same NCCL sequence, H5). Which NCCL setting makes it end: each variant 30 s at most.
cd "$(dirname "$0")/.."
python3 -m scripts.bench.make_data tokens /tmp/tok --train-gb 0.01 --val-mb 1 > /dev/null 2>&1
BASE=(--gpus 0,1 --model gpt --model-options '{"size":"tiny"}' --dataset tokens --data-dir /tmp/tok --dataset-options '{"block_size":1024}' --batch-size 8 --lr 6e-4 --optimizer adamw --heartbeat-timeout 10 --max-steps 60 --save-every-steps 20 --amp bf16 --clip-grad 1.0 --zero 2 --heal on --max-restarts 12 --bucket-mb 0.05)
run() {
  name=$1; shift
  mkdir -p /tmp/h6/$name
  env "$@" setsid python3 Train.py "${BASE[@]}" --save /tmp/h6/$name/s.pt --log-dir /tmp/h6/$name > $OUT/$name.out 2> $OUT/$name.err &
  pid=$!
  for i in $(seq 1 30); do sleep 1; kill -0 $pid 2>/dev/null || break; done
  kill -0 $pid 2>/dev/null && { echo "still running at 30 s" >> $OUT/$name.err; kill -9 -- -$pid; sleep 2; }
  wait $pid; rc=$?
  echo "$name: rc=$rc $(tr '\r' '\n' < $OUT/$name.err | grep update/s | tail -1 | cut -c1-90)"
}
run graph-register-0 NCCL_GRAPH_REGISTER=0
run graph-mixing-0 NCCL_GRAPH_MIXING_SUPPORT=0
run runtime-connect-0 NCCL_RUNTIME_CONNECT=0
run p2p-disable NCCL_P2P_DISABLE=1
