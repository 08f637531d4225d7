# x2 call H2: why the soak's heal-on GPT-2 --zero 2 run makes no step: four variants, each 75 s at most; a variant still
# running at 65 s gets every Python process of its session dumped by py-spy, then the session is killed.
cd "$(dirname "$0")/.."
git log --oneline -1 > $OUT/commit.txt 2>/dev/null || true
python3 -m scripts.bench.make_data tokens /tmp/tok --train-gb 0.05 --val-mb 2 > $OUT/make-tokens.log 2>&1
GPT=(--gpus 0,1 --model gpt --model-options '{"size":"124m"}' --dataset tokens --data-dir /tmp/tok --dataset-options '{"block_size":1024}' --batch-size 8 --amp bf16 --lr 6e-4 --optimizer adamw --clip-grad 1.0 --heartbeat-timeout 10 --max-steps 60 --save-every-steps 20)
run() {
  name=$1; shift
  mkdir -p /tmp/h2/$name
  setsid python3 Train.py "${GPT[@]}" "$@" --save /tmp/h2/$name/s.pt --log-dir $OUT/$name > $OUT/$name.out 2> $OUT/$name.err &
  pid=$!
  for i in $(seq 1 65); do sleep 1; kill -0 $pid 2>/dev/null || break; done
  if kill -0 $pid 2>/dev/null; then
    echo "still running at 65 s" >> $OUT/$name.err
    for p in $(pgrep -s $pid); do echo "=== pid $p: $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-150)"; timeout 20 /tmp/site/bin/py-spy dump --pid $p 2>&1 | head -80; done > $OUT/$name.stacks 2>&1
    kill -9 -- -$pid; sleep 2
  fi
  wait $pid; echo "rc=$?" >> $OUT/$name.err
  echo "$name: $(tail -c 300 $OUT/$name.err | tr '\r' '\n' | tail -2)"
}
run a-zero2-heal --zero 2 --heal on --max-restarts 12
run b-zero2-noheal --zero 2 --max-restarts 12
run c-zero0-heal --zero 0 --heal on --max-restarts 12
run d-zero2-heal-eager --zero 2 --heal on --max-restarts 12 --no-cuda-graph
pkill -9 -f Train.py; true
