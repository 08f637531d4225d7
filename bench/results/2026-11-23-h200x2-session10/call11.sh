set -u
# Session 10, call 1: GPU healing in place with ncclCommRevoke (ctypes, no GIL) and the attempt-tagged ticket.
python3 -c "
import cupy, torch; from cupy.cuda import nccl; from harness.comm import ncclstop
torch.cuda.init(); print('nccl', nccl.get_version(), 'lib', ncclstop.library(), 'version', ncclstop.version(ncclstop.library()))
c = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0); print('pointer', hex(ncclstop.comm_pointer(c) or 0)); c.destroy()
" > $OUT/ncclstop.log 2>&1
timeout 300 python3 -m pytest -q -p no:cacheprovider -s tests/test_heal_gpu.py > $OUT/heal_gpu_tests.log 2>&1
echo "rc=$?" >> $OUT/heal_gpu_tests.log
RESNET="--model resnet50 --dataset synthetic --dataset-options '{\"shape\":[3,224,224],\"num_classes\":1000,\"size\":2048}' --batch-size 64 --amp bf16"
HARNESS_STALL_DUMP_S=6 timeout 200 python3 scripts/soak_heal.py --gpus 0,1 --runs 1 --kills 4 --steps 400 --save-every-steps 100 --signals SIGKILL \
  --heal on --train-flags "$RESNET --heartbeat-timeout 10" --out $OUT/heal-resnet50.jsonl > $OUT/heal-resnet50.log 2>&1
echo "rc=$?" >> $OUT/heal-resnet50.log
ls $OUT/
