# x2 call H3: bisecting the hang of GPT-2 --zero 2 --heal on graphed (call H2: variant a hangs at its first step, eager and
# --zero 0 do not): variants of a, each killed if still running at 45 s.
cd "$(dirname "$0")/.."
git log --oneline -1 > $OUT/commit.txt 2>/dev/null || true
python3 -m scripts.bench.make_data tokens /tmp/tok --train-gb 0.05 --val-mb 2 > $OUT/make-tokens.log 2>&1
GPT=(--gpus 0,1 --model gpt --model-options '{"size":"124m"}' --dataset tokens --data-dir /tmp/tok --dataset-options '{"block_size":1024}' --batch-size 8 --lr 6e-4 --optimizer adamw --heartbeat-timeout 10 --max-steps 60 --save-every-steps 20)
run() {
  name=$1; shift
  mkdir -p /tmp/h2/$name
  setsid python3 Train.py "${GPT[@]}" "$@" --save /tmp/h2/$name/s.pt --log-dir $OUT/$name > $OUT/$name.out 2> $OUT/$name.err &
  pid=$!
  for i in $(seq 1 45); do sleep 1; kill -0 $pid 2>/dev/null || break; done
  if kill -0 $pid 2>/dev/null; then
    echo "still running at 45 s" >> $OUT/$name.err
    kill -9 -- -$pid; sleep 2
  fi
  wait $pid; echo "rc=$?" >> $OUT/$name.err
  echo "$name: $(tail -c 300 $OUT/$name.err | tr '\r' '\n' | tail -2)"
}
H=(--zero 2 --heal on --max-restarts 12)
A=(--amp bf16 --clip-grad 1.0)
run e-one-bucket "${A[@]}" "${H[@]}" --bucket-mb 4000
run f-zero1 "${A[@]}" --zero 1 --heal on --max-restarts 12
run g-tiny-buckets "${A[@]}" "${H[@]}" --model gpt --model-options '{"size":"tiny"}' --bucket-mb 0.05
run h-no-clip --amp bf16 "${H[@]}"
run i-fp32 --clip-grad 1.0 "${H[@]}"
pkill -9 -f Train.py; true
