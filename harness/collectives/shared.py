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
known at once, and the run keeps the socket, rather than a SIGBUS mid-run), mapped by the server at the join, and
unlinked once the join is answered, so nothing is left behind whatever dies later. Only the run's own processes
read them, the trust the sockets' files have: the HMAC key guards against other users, not the user's own.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

import torch

SHARED = "shared"
ROOT = Path("/dev/shm")


def _mapped(path: str, numel: int) -> torch.Tensor:
    return torch.from_file(path, shared=True, size=numel, dtype=torch.float32)


class SharedAreas:
    """A worker's push and pull areas: float32 vectors of its flat buffers' ``sizes``, each in a file (``paths``)
    mapped here. ``push`` and ``pull`` are their views, one per buffer."""

    def __init__(self, paths: dict[str, str], sizes: list[int]):
        self.paths, self.sizes = paths, sizes
        self.whole = {what: _mapped(path, sum(sizes)) for what, path in paths.items()}
        self.push, self.pull = (list(self.whole[what].split(sizes)) for what in ("push", "pull"))

    @classmethod
    def offered(cls, sizes: list[int], cuda: bool) -> SharedAreas | None:
        """The areas, made by a worker the parent forked on its own machine (None elsewhere, or where /dev/shm
        has no room: the socket is used then). ``cuda``: page-lock them, for the GPU's copies."""
        if not os.environ.get("HARNESS_PARENT_PID") or not ROOT.is_dir():
            return None
        token, nbytes = secrets.token_hex(8), 4 * sum(sizes)
        paths = {what: str(ROOT / f"harness-async-{os.getpid()}-{token}-{what}") for what in ("push", "pull")}
        try:
            for path in paths.values():
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.posix_fallocate(fd, 0, nbytes)
                finally:
                    os.close(fd)
            areas = cls(paths, sizes)
        except OSError:
            cls.unlink(paths)
            return None
        if cuda:
            for whole in areas.whole.values():
                torch.cuda.cudart().cudaHostRegister(whole.data_ptr(), whole.nbytes, 0)
        return areas

    @staticmethod
    def unlink(paths: dict[str, str]) -> None:
        """Remove the files (the mappings stay): once the server has mapped them, or they are not used."""
        for path in paths.values():
            Path(path).unlink(missing_ok=True)
