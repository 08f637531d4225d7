"""Local children forked from a warm interpreter: the zygote.

A local child used to be a fresh ``python -m harness.child``, and most of its start was importing its
preloads (torch: 2 to 5 s, and N children importing at once on a few cores take N times the CPU). The
zygote is one interpreter that imports the preloads once and then forks a child per request, in
milliseconds: a group starts as soon as the zygote is warm, a heal's replacement (and the warm spare
behind it) is ready at once, and a process that forks many groups (a test session, a sweep) imports
torch once. Nothing touches CUDA, threads or sockets in the zygote before it forks, so a child is
as clean as a fresh interpreter for everything CUDA, NCCL and ZeroMQ will do.

The parent's side (``Zygote``, one per set of preloads and environment, kept warm for the life of
the process, ``KEPT`` at most: ``for_environment``) and the zygote (``main``, in a ``python -c`` of its own)
talk over a Unix socket pair of datagrams (SOCK_SEQPACKET): each request is one JSON message (the
child's environment and working directory) with the child's stdout and stderr passed along as file
descriptors; the zygote says ``{"imported": [top-level modules]}`` once warm, answers ``{"started": pid}`` in
request order and later ``{"exited": pid, "returncode": rc}`` (negative: killed by that signal, as subprocess
reports it). ``Forked`` shows the parent's supervision a child as it showed a ``subprocess.Popen``: ``pid``,
``poll``, ``wait``, ``kill``, ``returncode`` and ``stderr``.

The zygote ignores SIGINT and SIGTERM (Ctrl-C reaches the whole process group: the children record it
and the parent decides) and exits when the parent's end of the socket closes, which the parent's
death does too; each child watches the zygote as its parent (harness/control/lifeline.py), so the
parent's death still ends every child. A child renames its process "harness.child" (``ps -o comm``,
/proc/PID/comm); its command line stays the zygote's.

Variables that Python and the preloads read at import (PYTHON*, TORCH*, ...: ``AT_IMPORT``) are the
zygote's, so a group whose environment differs from a zygote's in those gets a zygote of its own; the
rest of a child's environment is its own (set before anything reads it). Where only the module search path
differs (a test or a notebook that puts a folder of its own first), a warm zygote still serves if that path
finds every module it imported where its own found it (``Zygote.serves``); the child then searches its own.
What a fresh interpreter would have made anew, a child remakes: its name, numpy's seed, the temporary
directory, its thread count.
"""
from __future__ import annotations

import contextlib
import importlib.machinery
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Mapping, Sequence

from harness.plugins import preload

# The variables that Python, the loader and the preloads (torch, its compilers, the BLAS and OpenMP
# runtimes) may read while they are imported: a zygote serves only children that agree with it on
# these, on its preloads and on sys.path. Every other variable is the child's own, read after the fork
# (CUDA's at its first use, NCCL's at its first communicator, the harness's by the child), and so are
# those of AFTER_FORK, whatever their prefix.
AT_IMPORT = ("PYTHON", "LD_", "TORCH", "PYTORCH_", "TRITON", "MKL_", "OPENBLAS", "GOMP_", "KMP_", "HARNESS_PRELOAD",
             "HARNESS_SYS_PATH")
AFTER_FORK = ("PYTORCH_CUDA_ALLOC_CONF", "TORCHELASTIC_")
SEARCH_PATH = ("HARNESS_SYS_PATH", "PYTHONPATH")    # where the preloads are found: compared module by module
REAP_INTERVAL = 0.05        # s between the zygote's looks for children that ended
MESSAGE = 1 << 18           # the largest request: a child's environment


def _at_import(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(AT_IMPORT) and not k.startswith(AFTER_FORK)}


def _search_path(environment: Mapping[str, str]) -> list[str] | None:
    """The module search path a child of ``environment`` starts with (None where it is not given)."""
    return json.loads(environment["HARNESS_SYS_PATH"]) if "HARNESS_SYS_PATH" in environment else None


def _apart_from_search_path(environment: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environment.items() if k not in SEARCH_PATH}


def _found_at(name: str, path: list[str]) -> tuple | None:
    """Where a search of ``path`` finds the top-level module ``name`` (None: not on a path: built in, frozen, or
    found by another finder, such as an editable install's)."""
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    return None if spec is None else (spec.origin, tuple(spec.submodule_search_locations or ()))


class Forked:
    """A child the zygote forked, as the parent's supervision sees a subprocess.Popen."""

    def __init__(self, stderr: Any):
        self.stderr = stderr
        self.returncode: int | None = None
        self._pid: int | None = None
        self._changed = threading.Condition()

    @property
    def pid(self) -> int:
        """Its process id, once the zygote has forked it (the zygote may still be importing); 0 if the
        zygote died first."""
        with self._changed:
            self._changed.wait_for(lambda: self._pid is not None)
            return self._pid

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._changed:
            if not self._changed.wait_for(lambda: self.returncode is not None, timeout):
                raise subprocess.TimeoutExpired("harness.child", timeout)
            return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None and self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL; one the zygote has not forked yet is dead already, and is killed as it is forked."""
        with self._changed:
            if self._pid is None:
                self.returncode = -signal.SIGKILL
                self._changed.notify_all()
                return
        self.send_signal(signal.SIGKILL)

    def _set(self, pid: int | None = None, returncode: int | None = None) -> None:
        with self._changed:
            if pid and self._pid is None and self.returncode is not None:
                with contextlib.suppress(ProcessLookupError):      # killed before it was forked
                    os.kill(pid, signal.SIGKILL)
            self._pid = pid if pid is not None else self._pid
            self.returncode = returncode if returncode is not None and self.returncode is None else self.returncode
            self._changed.notify_all()


# Ctrl-C ignored before the first import: one in the zygote's first second printed a KeyboardInterrupt traceback.
# A host session's command (harness/launch/session.py) begins with it too.
DEAF = "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); signal.signal(signal.SIGTERM, signal.SIG_IGN); "
START = DEAF + "from harness.launch.zygote import main; main()"


class Zygote:
    """The parent's end of one zygote: ``fork(env)`` starts a child. Started by ``for_environment``."""

    def __init__(self, env: Mapping[str, str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._socket = ours
        self.process = subprocess.Popen([sys.executable, "-c", START, str(theirs.fileno())],
                                        env=dict(env), pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        self.environment = _at_import(env)
        self.found: dict[str, tuple | None] | None = None     # where its path found its top-level modules, once warm
        self._lock = threading.Lock()
        self._waiting: list[Forked] = []        # asked for, not yet forked: the zygote answers in order
        self._children: dict[int, Forked] = {}
        threading.Thread(target=self._read, name="harness-zygote", daemon=True).start()

    def fork(self, env: Mapping[str, str]) -> Forked:
        """A child with ``env`` as its environment, this process's working directory and stdout, and a
        pipe for its stderr."""
        read, write = os.pipe()
        child = Forked(os.fdopen(read, "rb"))
        request = json.dumps({"env": dict(env), "cwd": os.getcwd()}).encode()
        try:
            with self._lock:
                self._waiting.append(child)
                socket.send_fds(self._socket, [request], [1, write])        # fd 1: as a subprocess inherits it
        except OSError:             # the zygote is gone: the child ends at once, as a failed start
            child._set(pid=0, returncode=1)
        finally:
            os.close(write)
        return child

    def serves(self, env: Mapping[str, str]) -> bool:
        """Whether a child of ``env`` may be forked here: this zygote is up, and ``env`` agrees with it on what is
        read at import, or differs only in the search path (``SEARCH_PATH``), which finds every module the zygote
        imported where the zygote's own path found it (what a fresh interpreter would have imported is what the
        child has)."""
        theirs = _at_import(env)
        if self.process.poll() is not None:
            return False
        if theirs == self.environment:
            return True
        path = _search_path(theirs)
        if self.found is None or path is None or _apart_from_search_path(theirs) != \
                _apart_from_search_path(self.environment):
            return False
        return all(_found_at(name, path) == where for name, where in self.found.items())

    def live_children(self) -> int:
        with self._lock:
            return len(self._waiting) + sum(c.returncode is None for c in self._children.values())

    def close(self) -> None:
        """End the zygote (its children, if any, see their parent gone and exit)."""
        with contextlib.suppress(OSError):      # close() alone leaves the socket open while _read's recv
            self._socket.shutdown(socket.SHUT_RDWR)     # waits on it: the zygote would never see the end
        self._socket.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)

    def _read(self) -> None:
        while True:
            try:
                message = self._socket.recv(MESSAGE)
            except OSError:
                message = b""
            if not message:
                return self._lost()
            self._note(json.loads(message))

    def _note(self, message: dict) -> None:
        with self._lock:
            if "imported" in message:
                own = _search_path(self.environment)
                self.found = None if own is None else {name: _found_at(name, own) for name in message["imported"]}
            elif "started" in message:
                child = self._waiting.pop(0)
                self._children[message["started"]] = child
                child._set(pid=message["started"])
            else:
                child = self._children.pop(message["exited"], None)
                if child is not None:
                    child._set(returncode=message["returncode"])

    def _lost(self) -> None:
        """The zygote died: its children see that and exit; say so once each is gone."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
            children = dict(self._children)
        for child in waiting:
            child._set(pid=0, returncode=1)
        for pid, child in children.items():
            while Path(f"/proc/{pid}").exists() and child.returncode is None:
                time.sleep(REAP_INTERVAL)
            child._set(returncode=child.returncode if child.returncode is not None else 1)


_zygotes: list[Zygote] = []        # least recently used first
_registry = threading.Lock()
KEPT = 4            # zygotes kept warm at most: idle ones beyond this end, least recently used first


def for_environment(env: Mapping[str, str]) -> Zygote:
    """A zygote that serves children of ``env`` (its preloads and import-time variables: ``Zygote.serves``),
    started on first use. Idle zygotes of other environments stay warm, up to ``KEPT`` zygotes in all: a process
    that alternates environments (a sweep, a test session) does not import torch again for each group, and one
    that tries many does not keep an interpreter for each."""
    with _registry:
        zygote = next((z for z in reversed(_zygotes) if z.serves(env)), None)
        if zygote is None:
            zygote = Zygote({k: v for k, v in env.items()       # no run's key or endpoint
                             if not k.startswith("HARNESS_") or k in AT_IMPORT})
        else:
            _zygotes.remove(zygote)
        _zygotes.append(zygote)
        idle = [z for z in _zygotes if z is not zygote and z.live_children() == 0]
        for other in idle[:max(0, len(_zygotes) - KEPT)]:
            _zygotes.remove(other)
            other.close()
        return zygote


# -- the zygote ------------------------------------------------------------------------------------

def _warm_up() -> None:
    """Import what every child will: its preloads, from the parent's sys.path. A preload that fails
    is left to each child, which reports the error to the parent as a fresh interpreter would."""
    sys.path[:] = json.loads(os.environ.get("HARNESS_SYS_PATH", "[]")) or sys.path
    preload(["harness.child", *filter(None, os.environ.get("HARNESS_PRELOAD", "").split(","))])
    import warnings         # forking with a thread pool's idle threads (OpenBLAS's) is what we mean to do
    warnings.filterwarnings("ignore", message=".*use of fork\\(\\) may lead to deadlocks", category=DeprecationWarning)


def _become_child(server: socket.socket, request: dict, fds: Sequence[int]) -> None:
    """In the forked process: take the request's stdout, stderr, directory and environment, and run
    the harness's child. Never returns."""
    code = 1
    try:
        server.close()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        for target, fd in ((1, fds[0]), (2, fds[1]), (0, os.open(os.devnull, os.O_RDONLY))):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({**request["env"], "HARNESS_PARENT_PID": str(os.getppid())})
        if "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized():     # a preload used CUDA:
            os.execv(sys.executable, [sys.executable, "-m", "harness.child"])        # it cannot cross a fork
        _fresh_process_state()
        from harness import child
        child.main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _fresh_process_state() -> None:
    """What a fresh interpreter would have had of its own: the process name, numpy's global seed, the
    temporary directory from TMPDIR, torch's thread count from OMP_NUM_THREADS (OpenMP read the
    zygote's at load)."""
    tempfile.tempdir = None
    with contextlib.suppress(Exception):
        import ctypes
        ctypes.CDLL(None).prctl(15, b"harness.child", 0, 0, 0)        # PR_SET_NAME
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        sys.modules["torch"].set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))


def _reap(server: socket.socket) -> None:
    """Tell the parent of every child that ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        server.send(json.dumps({"exited": pid, "returncode": os.waitstatus_to_exitcode(status)}).encode())


def main() -> None:
    """The zygote's process (``python -c START FD``, which ignores SIGINT and SIGTERM first): warm up, then fork a
    child for each request on the socket FD until the parent closes it."""
    server = socket.socket(fileno=int(sys.argv[1]))
    _warm_up()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):    # the parent ended before it read all we said
        server.send(json.dumps({"imported": sorted({name.partition(".")[0] for name in sys.modules})}).encode())
        _serve(server)


def _serve(server: socket.socket) -> None:
    with selectors.DefaultSelector() as selector:
        selector.register(server, selectors.EVENT_READ)
        while True:
            if selector.select(REAP_INTERVAL):
                message, fds, _, _ = socket.recv_fds(server, MESSAGE, 2)
                if not message:
                    return
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _become_child(server, json.loads(message), fds)
                for fd in fds:
                    os.close(fd)
                server.send(json.dumps({"started": pid}).encode())
            _reap(server)
