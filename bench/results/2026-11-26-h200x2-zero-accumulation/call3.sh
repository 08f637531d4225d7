# Device call (2 GPUs), from .clean (0e30f2a): --zero 2 with smaller buckets (a parameter of --bucket-mb or more is a
# bucket of its own, reduce-scattered where autograd leaves it: no staging copy), against the default and DDP.
cd "$(dirname "$0")/../.clean"
export PYTHONPATH=/tmp/site:$PWD NANOGPT_DIR=$PWD/../.nanogpt
timeout -k 5 500 python3 - > $OUT/buckets.log 2>&1 <<'PY'
import json
from pathlib import Path
from scripts.bench.single import make_tokens
from scripts.bench.zero import row, gpt_flags, peer_row
tokens = make_tokens(Path("/tmp/tok"))
out = Path("/tmp/rows")
for name, zero, extra in [("z2-default", 2, []), ("z2-bucket1", 2, ["--bucket-mb", "1"]),
                          ("z2-bucket0.25", 2, ["--bucket-mb", "0.25"]), ("z0-default", 0, [])]:
    r = row(2, zero, 60, out / name, gpt_flags(2, tokens, None) + extra, "gpt-nanogpt")
    print(json.dumps({"name": name, **r}), flush=True)
print(json.dumps({"name": "ddp", **peer_row(2, "ddp", 0, 60, tokens, None)}), flush=True)
r = row(2, 2, 60, out / "z2-bucket1-again", gpt_flags(2, tokens, None) + ["--bucket-mb", "1"], "gpt-nanogpt")
print(json.dumps({"name": "z2-bucket1-again", **r}), flush=True)
PY
cat $OUT/buckets.log | grep '^{' | python3 -c "
import sys, json
for l in sys.stdin:
    r = json.loads(l); print(r['name'], round(r['step_ms'], 2), round(r['peak_mb'] or 0), r.get('largest_bucket_mb'))"
