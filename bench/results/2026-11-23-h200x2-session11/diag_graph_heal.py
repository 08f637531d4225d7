"""Session 11 diagnosis: why does a graphed GPU step not heal? Train.py (diag-patched) with graphs on,
rank 1 SIGKILLed, every worker's stacks dumped (SIGUSR1) 3, 7 and 12 s later."""
import json, os, signal, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, "tests")
from test_heal_gpu import SPINNING_MODEL, FLAGS
from test_recovery import workers_of

out = Path(os.environ["OUT"]) / f"diag-{sys.argv[1]}"
out.mkdir(parents=True)
(out / "spinning_model.py").write_text(SPINNING_MODEL)
(out / "tmp").mkdir()
env = {**os.environ, "TMPDIR": str(out / "tmp"), "PYTHONPATH": os.pathsep.join([str(out), os.environ.get("PYTHONPATH", "")])}
extra = sys.argv[2:]
with open(out / "stdout", "w") as so, open(out / "stderr", "w") as se:
    p = subprocess.Popen([sys.executable, str(Path("Train.py").resolve()), "--save", str(out / "model.pt"),
                          "--log-dir", str(out / "logs"), *FLAGS, "--max-restarts", "2", "--heal", "on", *extra],
                         cwd=out, env=env, stdout=so, stderr=se, start_new_session=True)
    log = out / "logs" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        if log.exists() and any(json.loads(l)["event"] == "step" for l in log.read_text().splitlines()):
            break
        time.sleep(0.05)
    workers = workers_of(p)
    t0 = time.time()
    print(f"DIAG {t0:.3f} killing {workers[1]} of {workers}", file=se, flush=True)
    os.kill(workers[1], signal.SIGKILL)
    for at in (3, 7, 12):
        time.sleep(max(0, t0 + at - time.time()))
        now = workers_of(p)
        print(f"DIAG {time.time():.3f} SIGUSR1 to {now}", file=se, flush=True)
        for pid in now:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
    try:
        p.wait(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
print(sys.argv[1], "rc", p.returncode, "heals", [r for r in (json.loads(l) for l in log.read_text().splitlines())
                                            if r["event"] in ("recovered", "restart", "healed")])
