"""A local async worker's pushes and pulls in shared memory (``--mode async`` at fp32, workers on the parent's machine).

Through the parent's socket, an exchange of GPT-2's 124M parameters moves 500 MB each way, framed, signed with
HMAC-SHA256 and checked on both sides, and copied through the kernel: 0.86 s of a 1.1 s stall per round on an
H200's host (bench/results/2026-11-27-h200-async-gpu). A worker that the parent forked on its own machine instead
keeps two files in /dev/shm that both processes map: it writes its pseudo-gradient into one (from its GPU straight
into that page-locked memory), the server reads it there, and writes its answer, the anchor, into the other, from
which the worker copies it. The messages still go through the socket, signed, but say ``SHARED`` in place of the
tensors. Workers started on other hosts (ssh, an agent, a cluster's launcher), and compressed exchanges, keep the
socket.

Why the areas need no lock:
- a worker writes its push area only at a push, and makes a push only after taking the answer to its last one,
  so the server has applied whatever it read there;
- the server writes a worker's pull area only to answer it, once a request of that worker's, and the worker
  makes its next request only after it has copied the answer out.

The files are made 0600 by the worker, reserved in full (``posix_fallocate``: a /dev/shm too small for them is
known at once, and the run keeps the socket, rather than a SIGBUS mid-run). The server maps them at the join, opening
them without creating them (a worker on another machine names files that do not exist here: it is answered through
the socket), and unlinks them at once; the worker unlinks them once the join is answered, or fails; and the parent
removes what a worker that died before its join left (``sweep``). The mappings live on until the processes end.
Only the run's own processes read them, the trust the sockets' files have: the HMAC key guards against other users,
not the user's own. Only a worker the parent forked itself offers them (``HARNESS_ON_PARENT_MACHINE``): namespaced
hosts on one machine share /dev/shm but are meant to talk over their links.
"""
from __future__ import annotations

import mmap
import os
import secrets
from pathlib import Path

import torch

SHARED = "shared"
ROOT = Path("/dev/shm")
PREFIX = "harness-async"


def _mapped(path: str, numel: int, create: bool) -> torch.Tensor:
    """``numel`` float32 elements of the file at ``path``, mapped shared; ``create``: make it (0600, reserved in
    full), else open it as it is, which must exist with that size."""
    nbytes = 4 * numel
    fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
    try:
        if create:
            os.posix_fallocate(fd, 0, nbytes)
        elif os.fstat(fd).st_size != nbytes:
            raise OSError(f"{path} holds {os.fstat(fd).st_size} bytes, not {nbytes}")
        return torch.frombuffer(mmap.mmap(fd, nbytes), dtype=torch.float32)
    finally:
        os.close(fd)


class SharedAreas:
    """A worker's push and pull areas: float32 vectors of its flat buffers' ``sizes``, each in a file (``paths``)
    mapped here (``create``: the worker makes them; the server opens them). ``push`` and ``pull`` are their views,
    one per buffer."""

    def __init__(self, paths: dict[str, str], sizes: list[int], create: bool = False):
        self.paths, self.sizes = paths, sizes
        self.whole = {}
        try:
            for what, path in paths.items():
                self.whole[what] = _mapped(path, sum(sizes), create)
        except (OSError, ValueError):
            if create:
                self.unlink(paths)
            raise
        self.push, self.pull = (list(self.whole[what].split(sizes)) for what in ("push", "pull"))

    @classmethod
    def offered(cls, sizes: list[int], cuda: bool) -> SharedAreas | None:
        """The areas, made by a worker the parent forked on its own machine (None elsewhere, or where /dev/shm
        has no room: the socket is used then). ``cuda``: page-lock them, for the GPU's copies (where that fails,
        the copies are only slower)."""
        if os.environ.get("HARNESS_ON_PARENT_MACHINE") != "1" or not ROOT.is_dir():
            return None
        token = secrets.token_hex(8)
        paths = {what: str(ROOT / f"{PREFIX}-{os.getpid()}-{token}-{what}") for what in ("push", "pull")}
        try:
            areas = cls(paths, sizes, create=True)
        except (OSError, ValueError):
            return None
        if cuda:
            for whole in areas.whole.values():
                torch.cuda.cudart().cudaHostRegister(whole.data_ptr(), whole.nbytes, 0)
        return areas

    @staticmethod
    def unlink(paths: dict[str, str]) -> None:
        """Remove the files (the mappings stay)."""
        for path in paths.values():
            Path(path).unlink(missing_ok=True)

    @staticmethod
    def sweep(pids: list[int]) -> None:
        """Remove what workers of these ``pids`` left in /dev/shm: those that died before their join was answered."""
        for pid in pids:
            for path in ROOT.glob(f"{PREFIX}-{pid}-*"):
                path.unlink(missing_ok=True)
