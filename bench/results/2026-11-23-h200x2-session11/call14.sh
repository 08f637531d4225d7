set -u
# Session 11, call 1: (a) why a graphed GPU step does not heal (diag-patched copy, stacks on SIGUSR1);
# (b) issue 13 on 2 GPUs with NCCL forced onto its socket transport (no P2P, no SHM, no IB), as two
# "hosts" of one GPU each: all-reduce bus bandwidth and ResNet-50 against torch.distributed / DDP.
ROOTDIR=$PWD
rm -rf /tmp/diag && cp -r . /tmp/diag && (cd /tmp/diag && python3 .devtools/diag_patch.py && \
  PYTHONPATH=/tmp/site:/tmp/diag timeout 180 python3 .devtools/diag_graph_heal.py graphed) > $OUT/diag.log 2>&1
echo "diag rc=$?" >> $OUT/diag.log
SOCK="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1"
env $SOCK NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET timeout 100 python3 scripts/bench_allreduce.py --gpus 0,1 --max-mib 256 --repeats 3 \
  --out $OUT/allreduce-socket > $OUT/allreduce-socket.log 2>&1; echo "rc=$?" >> $OUT/allreduce-socket.log
env $SOCK timeout 240 python3 scripts/bench_vs_ddp.py --gpus 2 --models resnet50 --variants ddp harness harness+graph \
  --first-step-model resnet50 --out $OUT/vs-ddp-socket > $OUT/vs-ddp-socket.log 2>&1; echo "rc=$?" >> $OUT/vs-ddp-socket.log
