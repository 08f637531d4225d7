# Device call (2 GPUs): FSDP2 keeping its parameters gathered between micro-batches, eager and compiled.
cd "$(dirname "$0")/.."
nvidia-smi topo -m > $OUT/topo.txt; cat $OUT/topo.txt
python3 -c "from pathlib import Path; from scripts.bench.single import make_tokens; make_tokens(Path('/tmp/tok'))"
for wrap in fsdp2 fsdp2-compile; do
timeout -k 5 200 python3 -m torch.distributed.run --standalone --nproc-per-node=2 -m scripts.bench.peers --model gpt-nanogpt --wrap $wrap --steps 15 --tokens /tmp/tok > $OUT/$wrap.log 2>&1
echo "rc=$?" >> $OUT/$wrap.log
grep -c -i recompil $OUT/$wrap.log; tail -2 $OUT/$wrap.log
done
grep -i -m 20 -E "recompil|graph break|Graph Break" $OUT/fsdp2-compile.log | cut -c1-300
