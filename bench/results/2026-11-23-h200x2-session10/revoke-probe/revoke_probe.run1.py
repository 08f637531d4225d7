#!/usr/bin/env python3
"""Probe: can ncclCommRevoke (NCCL >= 2.28.7) let a surviving rank recover cleanly, GPU state intact,
after its peer dies in the middle of a collective?  Compared with ncclCommAbort.

Driver:  python3 .devtools/revoke_probe.py [--scenarios a,b,...]
Workers: the same file with --worker {survivor,victim,replacement} (started by the driver with subprocess,
         rank r on GPU r through CUDA_VISIBLE_DEVICES, NCCL unique ids passed through files in a temp dir).

NCCL is driven through ctypes only (ctypes releases the GIL during foreign calls); torch for tensors/streams.
"""
import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

# ----------------------------------------------------------------------------------------------------------
# NCCL through ctypes (enum values checked against nccl.h 2.28.9)
# ----------------------------------------------------------------------------------------------------------
ncclSuccess, ncclInvalidArgument, ncclInvalidUsage, ncclInProgress = 0, 4, 5, 7
ncclInt32, ncclFloat32 = 2, 7
ncclSum = 0
NCCL_CONFIG_UNDEF_INT = -2147483648  # INT_MIN


class ncclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]  # NCCL_UNIQUE_ID_BYTES


class ncclConfig_t(ctypes.Structure):  # ncclConfig_v22800 layout of nccl.h 2.28.9
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("blocking", ctypes.c_int), ("cgaClusterSize", ctypes.c_int), ("minCTAs", ctypes.c_int),
                ("maxCTAs", ctypes.c_int), ("netName", ctypes.c_char_p), ("splitShare", ctypes.c_int),
                ("trafficClass", ctypes.c_int), ("commName", ctypes.c_char_p), ("collnetEnable", ctypes.c_int),
                ("CTAPolicy", ctypes.c_int), ("shrinkShare", ctypes.c_int), ("nvlsCTAs", ctypes.c_int),
                ("nChannelsPerNetPeer", ctypes.c_int), ("nvlinkCentricSched", ctypes.c_int)]


def find_nccl_candidates(allow_torch=True):
    cands = []
    try:
        import nvidia.nccl  # namespace package from nvidia-nccl-cu1x
        for d in list(getattr(nvidia.nccl, "__path__", [])):
            cands.append(("nvidia.nccl", os.path.join(d, "lib", "libnccl.so.2")))
    except Exception:
        pass
    if allow_torch:
        try:
            import torch
            cands.append(("torch/lib", os.path.join(os.path.dirname(torch.__file__), "lib", "libnccl.so.2")))
        except Exception:
            pass
    return cands


class NCCL:
    def __init__(self, allow_torch=True):
        lib, how, path = None, None, None
        for how_, p in find_nccl_candidates(allow_torch):
            if os.path.exists(p):
                lib, how, path = ctypes.CDLL(p), how_, p
                break
        if lib is None:
            lib, how, path = ctypes.CDLL("libnccl.so.2"), "plain CDLL(libnccl.so.2)", "libnccl.so.2"
        self.lib, self.how, self.path = lib, how, path
        L = lib
        vp, ci, csz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t

        def sig(name, restype, *argtypes):
            f = getattr(L, name)
            f.restype = restype
            f.argtypes = list(argtypes)
            return f

        self.GetVersion = sig("ncclGetVersion", ci, ctypes.POINTER(ci))
        self.GetUniqueId = sig("ncclGetUniqueId", ci, ctypes.POINTER(ncclUniqueId))
        self.CommInitRank = sig("ncclCommInitRank", ci, ctypes.POINTER(vp), ci, ncclUniqueId, ci)
        self.CommInitRankConfig = sig("ncclCommInitRankConfig", ci, ctypes.POINTER(vp), ci, ncclUniqueId, ci,
                                      ctypes.POINTER(ncclConfig_t))
        self.CommDestroy = sig("ncclCommDestroy", ci, vp)
        self.CommAbort = sig("ncclCommAbort", ci, vp)
        try:
            self.CommRevoke = sig("ncclCommRevoke", ci, vp, ci)
        except AttributeError:
            self.CommRevoke = None
        self.CommGetAsyncError = sig("ncclCommGetAsyncError", ci, vp, ctypes.POINTER(ci))
        self.GetErrorString = sig("ncclGetErrorString", ctypes.c_char_p, ci)
        self.GetLastError = sig("ncclGetLastError", ctypes.c_char_p, vp)
        self.AllReduce = sig("ncclAllReduce", ci, vp, vp, csz, ci, ci, vp, vp)
        self.Broadcast = sig("ncclBroadcast", ci, vp, vp, csz, ci, ci, vp, vp)

    def version(self):
        v = ctypes.c_int(0)
        self.GetVersion(ctypes.byref(v))
        return v.value

    def errstr(self, r):
        try:
            s = self.GetErrorString(r)
            return s.decode() if s else str(r)
        except Exception:
            return str(r)

    def last_error(self, comm):
        try:
            s = self.GetLastError(comm)
            return s.decode(errors="replace") if s else ""
        except Exception as e:
            return repr(e)

    def unique_id(self):
        uid = ncclUniqueId()
        r = self.GetUniqueId(ctypes.byref(uid))
        if r != ncclSuccess:
            raise NcclError("ncclGetUniqueId", r, self.errstr(r))
        return uid

    def async_error(self, comm):
        e = ctypes.c_int(-1)
        r = self.CommGetAsyncError(comm, ctypes.byref(e))
        return e.value if r == ncclSuccess else -100 - r

    def wait_ready(self, comm, timeout):
        t0 = time.monotonic()
        while True:
            e = self.async_error(comm)
            if e != ncclInProgress:
                return e
            if time.monotonic() - t0 > timeout:
                return ncclInProgress
            time.sleep(0.001)

    def init_rank(self, nranks, uid, rank, blocking=True, timeout=60):
        comm = ctypes.c_void_p()
        if blocking:
            r = self.CommInitRank(ctypes.byref(comm), nranks, uid, rank)
        else:
            cfg = ncclConfig_t()
            cfg.size = ctypes.sizeof(ncclConfig_t)
            cfg.magic = 0xcafebeef
            cfg.version = 22809
            for name, typ in ncclConfig_t._fields_[3:]:
                if typ is ctypes.c_int:
                    setattr(cfg, name, NCCL_CONFIG_UNDEF_INT)
            cfg.blocking = 0
            r = self.CommInitRankConfig(ctypes.byref(comm), nranks, uid, rank, ctypes.byref(cfg))
            if r == ncclInProgress:
                r = self.wait_ready(comm, timeout)
        if r != ncclSuccess:
            raise NcclError("ncclCommInitRank", r, self.errstr(r))
        return comm


class NcclError(RuntimeError):
    def __init__(self, what, code, s=""):
        super().__init__(f"{what} -> {code} ({s})")
        self.code = code


def nccl_maps():
    try:
        with open("/proc/self/maps") as f:
            return sorted({ln.split()[-1] for ln in f if "libnccl" in ln})
    except Exception:
        return []


# ----------------------------------------------------------------------------------------------------------
# worker helpers
# ----------------------------------------------------------------------------------------------------------
class Results:
    def __init__(self, path, base):
        self.path, self.d, self.lock = path, dict(base), threading.Lock()

    def set(self, **kw):
        with self.lock:
            self.d.update(kw)
            self.save_locked()

    def save_locked(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.d, f, default=str)
        os.replace(tmp, self.path)


def log(role, msg):
    sys.stderr.write(f"[{role} {time.time():.3f}] {msg}\n")
    sys.stderr.flush()


def write_atomic(path, data):
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def wait_file(path, timeout):
    t0 = time.monotonic()
    while not os.path.exists(path):
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"no {path} after {timeout}s")
        time.sleep(0.02)
    with open(path, "rb") as f:
        return f.read()


def timed_call(fn, timeout, name):
    """Run fn in its own thread; give up waiting after timeout (the thread may stay stuck)."""
    box = {}

    def run():
        t0 = time.monotonic()
        try:
            box["ret"] = fn()
        except BaseException as e:  # noqa
            box["exc"] = repr(e)
        box["dt"] = time.monotonic() - t0

    th = threading.Thread(target=run, daemon=True, name=name)
    t0 = time.monotonic()
    th.start()
    th.join(timeout)
    fin = not th.is_alive()
    return {"finished": fin, "ret": box.get("ret"), "exc": box.get("exc"),
            "dt": round(box.get("dt", time.monotonic() - t0), 4)}


class Heartbeat(threading.Thread):
    """Ticks every 0.1 s; the gaps show whether something holds the GIL."""

    def __init__(self, role):
        super().__init__(daemon=True, name="heartbeat")
        self.role, self.max_gap, self.window, self.window_max, self.ticks = role, 0.0, False, 0.0, 0
        self.window_ticks = []

    def run(self):
        last = time.monotonic()
        while True:
            time.sleep(0.1)
            t = time.monotonic()
            gap = t - last
            last = t
            self.ticks += 1
            self.max_gap = max(self.max_gap, gap)
            if self.window:
                self.window_max = max(self.window_max, gap)
                self.window_ticks.append(round(gap, 3))
                sys.stderr.write(f"[{self.role} hb {time.time():.3f}] gap={gap:.3f}\n")


class Trainer:
    """The model state and one training step; comm-agnostic (comm passed in)."""

    def __init__(self, nccl, torch, rank, world, numel, stream, init_params=True):
        self.nccl, self.torch, self.rank, self.world, self.n, self.stream = nccl, torch, rank, world, numel, stream
        dev = torch.device("cuda", 0)
        f32, i32 = torch.float32, torch.int32
        with torch.cuda.stream(stream):
            self.params = (torch.full((numel,), 1.0, dtype=f32, device=dev) if init_params
                           else torch.empty(numel, dtype=f32, device=dev))
            self.grad = torch.zeros(numel, dtype=f32, device=dev)
            self.ticket = torch.zeros(1, dtype=i32, device=dev)
            self.applied = torch.zeros(1, dtype=i32, device=dev)
            self.stepf = torch.zeros(1, dtype=f32, device=dev)
        self.graph = None

    def ar(self, comm, t, dtype, sh):
        r = self.nccl.AllReduce(ctypes.c_void_p(t.data_ptr()), ctypes.c_void_p(t.data_ptr()), t.numel(), dtype,
                                ncclSum, comm, ctypes.c_void_p(sh))
        if r == ncclInProgress:  # non-blocking communicator
            r = self.nccl.wait_ready(comm, 30)
        if r != ncclSuccess:
            raise NcclError("ncclAllReduce", r, self.nccl.errstr(r))

    def bcast(self, comm, t, dtype, sh):
        r = self.nccl.Broadcast(ctypes.c_void_p(t.data_ptr()), ctypes.c_void_p(t.data_ptr()), t.numel(), dtype, 0,
                                comm, ctypes.c_void_p(sh))
        if r == ncclInProgress:
            r = self.nccl.wait_ready(comm, 30)
        if r != ncclSuccess:
            raise NcclError("ncclBroadcast", r, self.nccl.errstr(r))

    def body(self, comm, sh, ev_grad=None, ev_ticket=None, grad_only=False):
        """One step on the current stream (sh = its handle): grad all-reduce, ticket all-reduce, guarded update.
        Captured as-is into a CUDA graph in graph mode (then without event records)."""
        torch = self.torch
        self.grad.copy_(self.stepf.expand_as(self.grad))
        self.ar(comm, self.grad, ncclFloat32, sh)
        if ev_grad is not None:
            ev_grad.record()
        if grad_only:
            return
        self.ticket.fill_(1)
        self.ar(comm, self.ticket, ncclInt32, sh)
        if ev_ticket is not None:
            ev_ticket.record()
        ok = self.ticket == self.world
        upd = self.grad * 1e-3
        upd.mul_(ok.to(torch.float32))
        self.params.sub_(upd)
        self.applied.add_(ok.to(torch.int32))

    def set_step(self, s):
        self.stepf.fill_(float(self.rank + s))

    def capture(self, comm):
        torch = self.torch
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        cap = torch.cuda.Stream()
        with torch.cuda.graph(g, stream=cap, capture_error_mode="thread_local"):
            self.body(comm, torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        self.graph = g

    def expected_fp32(self, n_applied):
        """Same fp32 ops on a 1-element copy, with the known all-reduced grads (sum over ranks of rank+s = 2s+1)."""
        torch = self.torch
        with torch.cuda.stream(self.stream):
            ref = torch.full((1,), 1.0, dtype=torch.float32, device="cuda")
            one = torch.ones(1, dtype=torch.float32, device="cuda")
            for s in range(1, n_applied + 1):
                g = torch.full((1,), float(sum(r + s for r in range(self.world))), dtype=torch.float32, device="cuda")
                upd = g * 1e-3
                upd.mul_(one)
                ref.sub_(upd)
        return ref

    def expected_f64(self, n_applied):
        p = 1.0
        for s in range(1, n_applied + 1):
            p -= 1e-3 * sum(r + s for r in range(self.world))
        return p

    def report(self, n_applied=None):
        """Needs a drained stream.  Checksums of params plus the diff against the expected value."""
        torch = self.torch
        with torch.cuda.stream(self.stream):
            applied = int(self.applied.item()) if n_applied is None else n_applied
            p = self.params
            out = {"applied": applied, "ticket": int(self.ticket.item()),
                   "params_min": float(p.min().item()), "params_max": float(p.max().item()),
                   "params_sum": float(p.double().sum().item()),
                   "params_bits_sum": int(p.view(torch.int32).to(torch.int64).sum().item()),
                   "nonfinite": int((~torch.isfinite(p)).sum().item())}
            ref = self.expected_fp32(applied)
            out["expected_fp32"] = float(ref.item())
            out["max_abs_diff_vs_expected"] = float((p - ref).abs().max().item())
            out["expected_f64"] = self.expected_f64(applied)
            out["max_abs_diff_vs_f64"] = max(abs(out["params_min"] - out["expected_f64"]),
                                             abs(out["params_max"] - out["expected_f64"]))
            torch.cuda.synchronize()
        return out


def setup_worker(args, role):
    import torch
    torch.cuda.set_device(0)
    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)
    nccl = NCCL()
    return torch, nccl, stream


SCEN = {
    "revoke_mid_collective": dict(method="revoke", blocking=True, graph=False),
    "abort_mid_collective": dict(method="abort", blocking=True, graph=False),
    "revoke_during_graph": dict(method="revoke", blocking=True, graph=True),
    "revoke_mid_collective_nonblocking": dict(method="revoke", blocking=False, graph=False),
}


# ----------------------------------------------------------------------------------------------------------
# roles
# ----------------------------------------------------------------------------------------------------------
def run_steps(tr, comm, torch, stream, first, last, stop, events, ev_grad, ev_ticket, graph_mode, warmup, role,
              victim_kill_step=None, res=None, state=None):
    """The training loop: host at most 2 steps ahead (event per step), no other host sync."""
    sh = stream.cuda_stream
    for s in range(first, last + 1):
        if stop is not None and stop.is_set():
            return "stop_flag"
        if (s - 2) in events:
            if state is not None:
                state["blocked_on"] = s - 2
            events[s - 2].synchronize()  # releases the GIL (torch)
            if state is not None:
                state["blocked_on"] = None
                if stop is not None and stop.is_set():
                    state["main_unblocked_at"] = time.monotonic()
                    return "stop_flag_after_unblock"
        if victim_kill_step is not None and s == victim_kill_step:
            # make the kill point deterministic: steps < K complete on both ranks
            torch.cuda.synchronize()
            if not graph_mode:
                tr.set_step(s)
                tr.body(comm, sh, grad_only=True)  # launch step K's grad all-reduce ...
                res.set(kill_wall=time.time(), killed_after="launch of step %d grad all-reduce" % s)
            else:
                res.set(kill_wall=time.time(), killed_after="sync after step %d; step %d graph not replayed" % (s - 1, s))
            log(role, f"SIGKILL self at step {s}")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)  # ... and die
            time.sleep(10)
        tr.set_step(s)
        if graph_mode and s > warmup:
            if tr.graph is None:
                tr.capture(comm)
                if res is not None:
                    res.set(graph_captured_before_step=s)
            tr.graph.replay()
        else:
            eg = torch.cuda.Event() if ev_grad is not None else None
            et = torch.cuda.Event() if ev_ticket is not None else None
            tr.body(comm, sh, eg, et)
            if ev_grad is not None:
                ev_grad[s], ev_ticket[s] = eg, et
        ev = torch.cuda.Event()
        ev.record()
        events[s] = ev
        if state is not None:
            state["launched"] = s
    return "done"


def worker_victim(args):
    role = "victim"
    sc = SCEN[args.scenario]
    res = Results(os.path.join(args.dir, "res_victim.json"), {"role": role, "scenario": args.scenario, "rank": 1})
    torch, nccl, stream = setup_worker(args, role)
    res.set(nccl_version=nccl.version(), nccl_path=nccl.path)
    uid = ncclUniqueId.from_buffer_copy(wait_file(os.path.join(args.dir, "uid_0.bin"), 60))
    comm = nccl.init_rank(2, uid, 1, sc["blocking"])
    tr = Trainer(nccl, torch, 1, 2, args.numel, stream)
    torch.cuda.synchronize()
    res.set(init_done=time.time())
    run_steps(tr, comm, torch, stream, 1, args.kill_step, None, {}, None, None, sc["graph"], args.warmup, role,
              victim_kill_step=args.kill_step, res=res)
    res.set(error="victim survived its kill step?!")
    sys.exit(3)


def worker_replacement(args):
    role = "replacement"
    sc = SCEN[args.scenario]
    t_start = time.monotonic()
    res = Results(os.path.join(args.dir, "res_replacement.json"),
                  {"role": role, "scenario": args.scenario, "rank": 1, "start_wall": time.time()})
    torch, nccl, stream = setup_worker(args, role)
    tr = Trainer(nccl, torch, 1, 2, args.numel, stream, init_params=False)
    torch.cuda.synchronize()
    res.set(ready_s=round(time.monotonic() - t_start, 3), nccl_version=nccl.version())
    raw = wait_file(os.path.join(args.dir, "uid_1.bin"), args.replacement_wait)
    t0 = time.monotonic()
    comm = nccl.init_rank(2, ncclUniqueId.from_buffer_copy(raw), 1, sc["blocking"])
    res.set(init_s=round(time.monotonic() - t0, 3))
    sh = stream.cuda_stream
    tr.bcast(comm, tr.params, ncclFloat32, sh)
    tr.bcast(comm, tr.applied, ncclInt32, sh)
    base = int(tr.applied.item())
    res.set(received_applied=base)
    for s in range(base + 1, base + 1 + args.extra_steps):
        tr.set_step(s)
        tr.body(comm, sh)
    torch.cuda.synchronize()
    rep = tr.report()
    res.set(final=rep, destroy=timed_call(lambda: nccl.CommDestroy(comm), 30, "destroy"))
    log(role, "done")
    sys.stdout.flush()
    os._exit(0)


def worker_survivor(args):
    role = "survivor"
    sc = SCEN[args.scenario]
    res = Results(os.path.join(args.dir, "res_survivor.json"), {"role": role, "scenario": args.scenario, "rank": 0})
    torch, nccl, stream = setup_worker(args, role)
    res.set(nccl_version=nccl.version(), nccl_path=nccl.path, nccl_loaded_via=nccl.how,
            torch=torch.__version__, method=sc["method"], blocking=sc["blocking"], graph=sc["graph"],
            has_revoke=nccl.CommRevoke is not None, numel=args.numel, kill_step=args.kill_step)
    uid = nccl.unique_id()
    write_atomic(os.path.join(args.dir, "uid_0.bin"), bytes(uid))
    comm = nccl.init_rank(2, uid, 0, sc["blocking"])
    res.set(nccl_maps=nccl_maps())
    tr = Trainer(nccl, torch, 0, 2, args.numel, stream)
    torch.cuda.synchronize()
    hb = Heartbeat(role)
    hb.start()
    stop = threading.Event()
    events, ev_grad, ev_ticket = {}, ({} if not sc["graph"] else None), ({} if not sc["graph"] else None)
    state = {"launched": 0, "blocked_on": None, "main_unblocked_at": None}
    healer_done = threading.Event()

    def heal():
        torch.cuda.set_device(0)
        torch.cuda.set_stream(stream)
        done, last_change = 0, time.monotonic()
        while True:
            time.sleep(0.05)
            while (done + 1) in events and events[done + 1].query():
                done += 1
                last_change = time.monotonic()
            if state["launched"] > done and time.monotonic() - last_change > args.stall_s:
                break
        t_detect = time.monotonic()
        k = done + 1
        stuck_in = "n/a (graph)"
        if ev_grad is not None and k in ev_grad:
            stuck_in = "ticket all-reduce (grad all-reduce done)" if ev_grad[k].query() else "grad all-reduce"
        res.set(detect_wall=time.time(), steps_done_at_detect=done, steps_launched_at_detect=state["launched"],
                stuck_step=k, stuck_in=stuck_in, main_blocked_on_event_of_step=state["blocked_on"],
                async_error_before=nccl.async_error(comm), stall_s=args.stall_s)
        log(role, f"stall detected: done={done} launched={state['launched']} stuck_in={stuck_in}")
        stop.set()
        hb.window = True
        t_call = time.monotonic()
        if sc["method"] == "revoke":
            call = timed_call(lambda: nccl.CommRevoke(comm, 0), args.op_timeout, "revoke")
        else:
            call = timed_call(lambda: nccl.CommAbort(comm), args.op_timeout, "abort")
        call["ret_str"] = nccl.errstr(call["ret"]) if call["ret"] is not None else None
        res.set(**{sc["method"]: call})
        log(role, f"{sc['method']} -> {call}")
        if not call["finished"]:
            hb.window = False
            res.set(outcome=f"{sc['method']} call did not return within {args.op_timeout}s",
                    heartbeat={"max_gap_s": round(hb.max_gap, 3), "max_gap_heal_window_s": round(hb.window_max, 3)})
            os._exit(4)
        if sc["method"] == "revoke":
            q0, polls, code = time.monotonic(), 0, None
            while True:
                code = nccl.async_error(comm)
                polls += 1
                if code != ncclInProgress or time.monotonic() - t_call > args.op_timeout:
                    break
                time.sleep(0.001)
            res.set(quiesce={"code": code, "code_str": nccl.errstr(code), "poll_s": round(time.monotonic() - q0, 4),
                             "since_revoke_call_s": round(time.monotonic() - t_call, 4), "polls": polls,
                             "last_error": nccl.last_error(comm)})
        sync = timed_call(torch.cuda.synchronize, args.op_timeout, "synchronize")
        res.set(synchronize=sync)
        log(role, f"synchronize -> {sync}")
        time.sleep(0.3)  # let the main thread notice (if it was blocked) before reading it
        hb.window = False
        res.set(heartbeat={"max_gap_s": round(hb.max_gap, 3), "max_gap_heal_window_s": round(hb.window_max, 3),
                           "heal_window_ticks": len(hb.window_ticks)},
                main_unblocked_after_call_s=(round(state["main_unblocked_at"] - t_call, 4)
                                             if state["main_unblocked_at"] else None),
                main_thread_still_blocked=state["blocked_on"] is not None)
        if not sync["finished"] or sync["exc"]:
            res.set(outcome="torch.cuda.synchronize did not return after " + sc["method"])
            os._exit(5)
        after = tr.report()
        after["applied_ok"] = after["applied"] == args.kill_step - 1
        res.set(after_heal=after)
        log(role, f"after heal: {after}")
        if tr.graph is not None:
            tr.graph.reset()
            tr.graph = None
            torch.cuda.synchronize()
        if sc["method"] == "revoke":
            d = timed_call(lambda: nccl.CommDestroy(comm), args.op_timeout, "destroy")
            res.set(destroy=d)
            log(role, f"destroy -> {d}")
            if not d["finished"]:
                res.set(outcome="ncclCommDestroy after revoke did not return")
                os._exit(6)
        else:
            res.set(destroy="n/a (ncclCommAbort frees the communicator)")
        # --- recovery with a replacement rank 1 (started by the driver when the victim died) ---
        rec = {}
        t_r = time.monotonic()
        uid1 = nccl.unique_id()
        write_atomic(os.path.join(args.dir, "uid_1.bin"), bytes(uid1))
        box = {}
        ini = timed_call(lambda: box.setdefault("c", nccl.init_rank(2, uid1, 0, sc["blocking"])), 90, "init2")
        rec["init"] = ini
        if not ini["finished"] or ini["exc"]:
            res.set(recovery=rec, outcome="new communicator did not form")
            os._exit(7)
        comm2 = box["c"]
        sh = stream.cuda_stream
        base = int(tr.applied.item())
        tr.bcast(comm2, tr.params, ncclFloat32, sh)
        tr.bcast(comm2, tr.applied, ncclInt32, sh)
        torch.cuda.synchronize()
        rec["first_collective_after_detect_s"] = round(time.monotonic() - t_detect, 3)
        for i, s in enumerate(range(base + 1, base + 1 + args.extra_steps)):
            tr.set_step(s)
            eg = torch.cuda.Event()
            tr.body(comm2, sh, ev_grad=eg)
            if i == 0:
                eg.synchronize()
                rec["first_allreduce_after_detect_s"] = round(time.monotonic() - t_detect, 3)
        torch.cuda.synchronize()
        rec["steps_after_detect_s"] = round(time.monotonic() - t_detect, 3)
        rec["recovery_wall_s"] = round(time.monotonic() - t_r, 3)
        rec["final"] = tr.report()
        rec["final"]["applied_ok"] = rec["final"]["applied"] == base + args.extra_steps
        rec["destroy"] = timed_call(lambda: nccl.CommDestroy(comm2), args.op_timeout, "destroy2")
        res.set(recovery=rec, outcome="ok")
        log(role, f"recovery: {rec}")
        healer_done.set()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def heal_guarded():
        try:
            heal()
        except BaseException:
            import traceback
            tb = traceback.format_exc()
            sys.stderr.write(tb)
            sys.stderr.flush()
            res.set(outcome="healer exception: " + tb.strip().splitlines()[-1], healer_traceback=tb)
            os._exit(10)

    th = threading.Thread(target=heal_guarded, name="watchdog-healer", daemon=True)
    th.start()
    how = "?"
    try:
        how = run_steps(tr, comm, torch, stream, 1, args.kill_step + 30, stop, events, ev_grad, ev_ticket,
                        sc["graph"], args.warmup, role, res=res, state=state)
    except Exception as e:  # e.g. ncclInvalidUsage from a revoked comm
        how = "exception: " + repr(e)
        state["main_unblocked_at"] = state["main_unblocked_at"] or time.monotonic()
    res.set(main_loop_exit=how, main_loop_exit_wall=time.time())
    log(role, f"main loop exit: {how}")
    healer_done.wait(args.op_timeout * 4)
    res.set(outcome=res.d.get("outcome") or "healer did not finish")
    os._exit(8)


# ----------------------------------------------------------------------------------------------------------
# fake workers (PROBE_FAKE=1|hang): test the driver without a GPU
# ----------------------------------------------------------------------------------------------------------
def fake_worker(args):
    mode = os.environ.get("PROBE_FAKE")
    p = lambda r: os.path.join(args.dir, f"res_{r}.json")  # noqa
    if args.worker == "victim":
        wait_file(os.path.join(args.dir, "uid_0.bin"), 10)
        json.dump({"role": "victim", "kill_wall": time.time()}, open(p("victim"), "w"))
        os.kill(os.getpid(), signal.SIGKILL)
    if args.worker == "survivor":
        write_atomic(os.path.join(args.dir, "uid_0.bin"), b"x" * 128)
        sys.stderr.write("fake survivor stderr line\n")
        if mode == "hang" and args.scenario.startswith("abort"):
            json.dump({"role": "survivor", "outcome": "partial"}, open(p("survivor"), "w"))
            time.sleep(1000)
        time.sleep(1.0)
        write_atomic(os.path.join(args.dir, "uid_1.bin"), b"y" * 128)
        time.sleep(0.5)
        json.dump({"role": "survivor", "outcome": "ok", "detect_wall": time.time() - 1.0,
                   "revoke": {"dt": 0.01, "finished": True, "ret": 0},
                   "quiesce": {"code": 0, "since_revoke_call_s": 0.02},
                   "heartbeat": {"max_gap_s": 0.1, "max_gap_heal_window_s": 0.1},
                   "synchronize": {"finished": True, "dt": 0.001},
                   "after_heal": {"applied": 19, "applied_ok": True, "max_abs_diff_vs_expected": 0.0},
                   "destroy": {"dt": 0.1, "finished": True, "ret": 0},
                   "recovery": {"first_allreduce_after_detect_s": 2.0, "final": {"params_bits_sum": 5, "params_sum": 1.0}}},
                  open(p("survivor"), "w"))
    if args.worker == "replacement":
        wait_file(os.path.join(args.dir, "uid_1.bin"), 10)
        json.dump({"role": "replacement", "final": {"params_bits_sum": 5, "params_sum": 1.0}},
                  open(p("replacement"), "w"))
    sys.exit(0)


# ----------------------------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------------------------
def tail(path, n=60):
    try:
        with open(path, errors="replace") as f:
            lines = f.readlines()
        return "".join(lines[-n:])
    except Exception as e:
        return f"<{e}>"


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except Exception:
        return None


def run_scenario(name, args, deadline_s):
    d = tempfile.mkdtemp(prefix=f"revoke_probe_{name}_")
    common = ["--scenario", name, "--dir", d, "--numel", str(args.numel), "--kill-step", str(args.kill_step),
              "--stall-s", str(args.stall_s), "--op-timeout", str(args.op_timeout), "--warmup", str(args.warmup),
              "--extra-steps", str(args.extra_steps)]
    me = os.path.abspath(__file__)
    procs = {}

    def spawn(role, gpu):
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        env["NCCL_NVLS_ENABLE"] = "0"
        env.setdefault("NCCL_DEBUG", "WARN")
        env["PYTHONUNBUFFERED"] = "1"
        out = open(os.path.join(d, f"{role}.out"), "w")
        err = open(os.path.join(d, f"{role}.err"), "w")
        p = subprocess.Popen([sys.executable, me, "--worker", role] + common, env=env, stdout=out, stderr=err,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        procs[role] = {"p": p, "t0": time.monotonic(), "rc": None, "killed_by_driver": False}
        return p

    t0 = time.monotonic()
    spawn("survivor", 0)
    spawn("victim", 1)
    timed_out = False
    events = []
    while True:
        time.sleep(0.05)
        for role, info in procs.items():
            if info["rc"] is None and info["p"].poll() is not None:
                info["rc"] = info["p"].returncode
                events.append(f"{time.monotonic() - t0:.2f}s {role} exited rc={info['rc']}")
        v = procs["victim"]
        if v["rc"] == -signal.SIGKILL and "replacement" not in procs and procs["survivor"]["rc"] is None:
            spawn("replacement", 1)
            events.append(f"{time.monotonic() - t0:.2f}s replacement spawned")
        if v["rc"] is not None and v["rc"] != -signal.SIGKILL and procs["survivor"]["rc"] is None \
                and "victim_failed" not in events:
            events.append("victim_failed")
            # victim died without the planned kill: the survivor will stall; let the deadline or heal handle it
        if procs["survivor"]["rc"] is not None and "replacement" in procs and procs["replacement"]["rc"] is None:
            # give the replacement a few seconds to finish once the survivor is gone
            procs["survivor"].setdefault("gone_at", time.monotonic())
            if time.monotonic() - procs["survivor"]["gone_at"] > 15:
                timed_out = True
        if procs["survivor"]["rc"] not in (None, 0) and procs["victim"]["rc"] is None:
            procs["survivor"].setdefault("failed_at", time.monotonic())
            if time.monotonic() - procs["survivor"]["failed_at"] > 10:
                timed_out = True  # survivor failed early; the victim would wait forever
        if all(i["rc"] is not None for i in procs.values()):
            break
        if time.monotonic() - t0 > deadline_s or timed_out:
            timed_out = True
            break
    for role, info in procs.items():
        if info["rc"] is None:
            info["killed_by_driver"] = True
            try:
                os.killpg(info["p"].pid, signal.SIGKILL)
            except Exception:
                info["p"].kill()
            try:
                info["p"].wait(10)
            except Exception:
                pass
            info["rc"] = info["p"].returncode
            events.append(f"{time.monotonic() - t0:.2f}s {role} killed by driver (deadline {deadline_s}s)")
    wall = time.monotonic() - t0
    results = {}
    for role in ("survivor", "victim", "replacement"):
        r = read_json(os.path.join(d, f"res_{role}.json"))
        if r is None and role not in procs:
            continue
        r = r or {"role": role, "error": "no result file"}
        if role in procs:
            r["exit_code"] = procs[role]["rc"]
            r["killed_by_driver"] = procs[role]["killed_by_driver"]
        results[role] = r
        print(json.dumps({"scenario": name, "role": role, **r}, default=str), flush=True)
    expected_rc = {"survivor": 0, "victim": -signal.SIGKILL, "replacement": 0}
    failed = timed_out or any(procs[r]["rc"] != expected_rc[r] for r in procs) or "replacement" not in procs
    for role in procs:
        try:
            with open(os.path.join(d, role + ".err"), errors="replace") as f:
                nl = [ln.rstrip() for ln in f if "NCCL" in ln and ("WARN" in ln or "INFO" in ln)]
        except Exception:
            nl = []
        if nl:
            print(f"--- {name}: {role} NCCL log lines ({len(nl)}, last 15) ---\n" + "\n".join(nl[-15:]), flush=True)
    if failed:
        print(f"--- {name}: FAILURE/TIMEOUT; driver events: {events}", flush=True)
        for role in procs:
            print(f"--- {name}: {role} stderr (tail) ---\n{tail(os.path.join(d, role + '.err'))}", flush=True)
            o = tail(os.path.join(d, role + ".out"), 20)
            if o.strip():
                print(f"--- {name}: {role} stdout (tail) ---\n{o}", flush=True)
    return summarize(name, results, events, wall, timed_out)


def summarize(name, results, events, wall, timed_out):
    s = results.get("survivor", {})
    v = results.get("victim", {})
    rp = results.get("replacement", {})
    call = s.get("revoke") or s.get("abort") or {}
    ah = s.get("after_heal") or {}
    rec = s.get("recovery") or {}
    fin0 = (rec.get("final") or {})
    fin1 = (rp.get("final") or {})
    out = {
        "scenario": name, "outcome": s.get("outcome"), "scenario_wall_s": round(wall, 2), "timed_out": timed_out,
        "nccl_version": s.get("nccl_version"), "nccl_path": s.get("nccl_path"),
        "kill_to_detect_s": (round(s["detect_wall"] - v["kill_wall"], 3)
                             if s.get("detect_wall") and v.get("kill_wall") else None),
        "stuck_in": s.get("stuck_in"),
        "call": ("revoke" if "revoke" in s else "abort" if "abort" in s else None),
        "call_s": call.get("dt"), "call_returned": call.get("finished"), "call_ret": call.get("ret"),
        "heartbeat_max_gap_heal_s": (s.get("heartbeat") or {}).get("max_gap_heal_window_s"),
        "heartbeat_max_gap_s": (s.get("heartbeat") or {}).get("max_gap_s"),
        "quiesce_code": (s.get("quiesce") or {}).get("code"),
        "quiesce_since_call_s": (s.get("quiesce") or {}).get("since_revoke_call_s"),
        "sync_returned": (s.get("synchronize") or {}).get("finished"),
        "sync_s": (s.get("synchronize") or {}).get("dt"),
        "main_unblocked_after_call_s": s.get("main_unblocked_after_call_s"),
        "main_loop_exit": s.get("main_loop_exit"),
        "applied": ah.get("applied"), "applied_ok": ah.get("applied_ok"),
        "max_abs_diff_vs_expected": ah.get("max_abs_diff_vs_expected"),
        "destroy_s": (s.get("destroy") or {}).get("dt") if isinstance(s.get("destroy"), dict) else s.get("destroy"),
        "new_comm_ok": bool(fin0) and bool(fin1),
        "replicas_match": (fin0.get("params_bits_sum") == fin1.get("params_bits_sum")
                           and fin0.get("params_sum") == fin1.get("params_sum")) if fin0 and fin1 else None,
        "final_max_abs_diff_vs_expected": fin0.get("max_abs_diff_vs_expected"),
        "replacement_ready_s": rp.get("ready_s"),
        "recovery_detect_to_first_allreduce_s": rec.get("first_allreduce_after_detect_s"),
        "driver_events": events,
    }
    return out


def driver(args):
    t_start = time.monotonic()
    try:
        n = NCCL(allow_torch=True)
        print(f"driver: NCCL {n.version()} loaded from {n.path} via {n.how}; "
              f"ncclCommRevoke {'present' if n.CommRevoke else 'ABSENT'}", flush=True)
    except Exception as e:
        print(f"driver: could not load NCCL in the driver: {e!r}", flush=True)
    print(f"driver: python {sys.version.split()[0]}, NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}, "
          f"numel={args.numel}, kill_step={args.kill_step}, stall_s={args.stall_s}", flush=True)
    summaries = []
    for name in args.scenarios.split(","):
        left = args.budget - (time.monotonic() - t_start)
        if left < 30:
            summaries.append({"scenario": name, "outcome": f"skipped: {left:.0f}s of the budget left"})
            print(json.dumps(summaries[-1]), flush=True)
            continue
        dl = min(args.deadline, left - 5)
        print(f"=== scenario {name} (deadline {dl:.0f}s) ===", flush=True)
        summaries.append(run_scenario(name, args, dl))
    print("=== SUMMARY ===", flush=True)
    for s in summaries:
        print("SUMMARY " + json.dumps(s, default=str), flush=True)
    print(f"driver: total {time.monotonic() - t_start:.1f}s", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", choices=["survivor", "victim", "replacement"])
    ap.add_argument("--scenario", default="revoke_mid_collective")
    ap.add_argument("--scenarios", default="revoke_mid_collective,abort_mid_collective,revoke_during_graph,"
                                           "revoke_mid_collective_nonblocking")
    ap.add_argument("--dir")
    ap.add_argument("--numel", type=int, default=64 * 1024 * 1024)
    ap.add_argument("--kill-step", type=int, default=20)
    ap.add_argument("--stall-s", type=float, default=3.0)
    ap.add_argument("--op-timeout", type=float, default=30.0)
    ap.add_argument("--warmup", type=int, default=3, help="eager steps before the CUDA graph capture (graph mode)")
    ap.add_argument("--extra-steps", type=int, default=5)
    ap.add_argument("--replacement-wait", type=float, default=90.0)
    ap.add_argument("--deadline", type=float, default=85.0, help="per-scenario hard deadline (s)")
    ap.add_argument("--budget", type=float, default=340.0, help="whole-run budget (s)")
    args = ap.parse_args()
    if args.worker:
        if os.environ.get("PROBE_FAKE"):
            return fake_worker(args)
        try:
            {"survivor": worker_survivor, "victim": worker_victim, "replacement": worker_replacement}[args.worker](args)
        except SystemExit:
            raise
        except BaseException:
            import traceback
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(9)
    else:
        driver(args)


if __name__ == "__main__":
    main()
