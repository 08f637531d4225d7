"""Session 11 diagnosis only (applied on the device copy, never committed to harness/): lets a graphed
GPU step heal, dumps every thread's stack on SIGUSR1, and prints timestamps along the heal path."""
import re, sys
from pathlib import Path

def sub(path, old, new):
    p = Path(path); text = p.read_text()
    assert old in text, (path, old)
    p.write_text(text.replace(old, new, 1))

sub("Train.py", '    if args.cuda_graph is not False:\n        return "a CUDA-graphed step (pass --no-cuda-graph)"\n', "")
sub("harness/child.py", "def main() -> None:\n", "def main() -> None:\n    faulthandler.register(signal.SIGUSR1, all_threads=True)\n")
T = "__import__('sys').stderr.write(f\"DIAG {__import__('time').time():.3f} pid {__import__('os').getpid()} %s\\n\"); __import__('sys').stderr.flush()"
sub("harness/train.py", "            if not config[\"heal\"]:\n                raise\n            sync.close()\n",
    "            " + T % "caught {type(error).__name__}: {str(error)[:200]}" + "\n            if not config[\"heal\"]:\n                raise\n            sync.close()\n            " + T % "sync closed" + "\n")
sub("harness/train.py", "            heal(where)\n", "            " + T % "rejoined, where {where}" + "\n            heal(where)\n            " + T % "healed" + "\n")
sub("harness/heal.py", "    ctx.release(comm)\n", "    " + T % "releasing" + "\n    ctx.release(comm)\n    " + T % "released" + "\n")
sub("harness/heal.py", "    gc.collect()\n", "    " + T % "synchronized" + "\n    gc.collect()\n")
sub("harness/heal.py", "    return ctx.communicator()\n", "    " + T % "heal notice" + "\n    return ctx.communicator()\n")
print("diag patch applied")
