"""A child's watch on its parent: a child whose parent is gone exits at once.

Nobody else would ever stop it, and it may hold a GPU. How a child notices depends on where it runs:

* on the parent's machine its parent process is the parent itself: when ``getppid`` changes, it is
  gone. A parent that was killed could not remove its private socket directory; its children do
  (each its socket, and the directory once empty);
* on another host its parent process is sshd's or slurmstepd's: the parent sends heartbeats instead
  (harness/control/supervise.py), and a child that hears nothing for the heartbeat timeout exits (its
  host may have been cut off from the parent's);
* started over ssh (``python -m harness.child --stdin``), its settings come as one JSON line on
  stdin, which then stays open for as long as the parent's ssh client runs: end of stdin is the end.

The serve loop (harness/control/serve.py) calls ``Lifeline.check`` on every housekeeping tick and
``Lifeline.heard`` for every message from the parent.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time


class Lifeline:
    """What a child knows of its parent: its pid (local children) or when it was last heard (remote)."""

    def __init__(self) -> None:
        self._parent_pid = int(os.environ.get("HARNESS_PARENT_PID", os.getppid()))
        self._endpoint = os.environ.get("HARNESS_ENDPOINT", "")
        self._timeout = float(os.environ.get("HARNESS_HEARTBEAT_TIMEOUT", "inf"))   # set for remote children
        self._heard = time.monotonic()

    def heard(self) -> None:
        """A message came from the parent."""
        self._heard = time.monotonic()

    def check(self) -> None:
        """Exit this process if the parent is gone."""
        if os.getppid() != self._parent_pid:
            _remove_socket_directory(self._endpoint)
            os._exit(1)   # the parent is gone: nobody will ever stop us, and our GPU must be freed
        silent = time.monotonic() - self._heard
        if silent > self._timeout:
            exit_because(f"nothing heard from the parent for {silent:.0f} s: it or the network is gone")


def environment_from_stdin() -> None:
    """``--stdin`` (a child started over ssh): the environment comes as one JSON line, and then stdin
    stays open for as long as the parent's ssh client runs."""
    os.environ.update(json.loads(sys.stdin.buffer.readline() or b"{}"))

    def watch() -> None:
        while sys.stdin.buffer.read(65536):
            pass
        exit_because("the parent's ssh session ended")
    threading.Thread(target=watch, name="harness-stdin", daemon=True).start()


def exit_because(reason: str) -> None:
    """Say why on stderr, where it can still be read, and exit. Over ssh, stderr went with the session that
    ended: the write fails (a broken pipe), and the exit must not fail with it."""
    try:
        sys.stderr.write(f"harness child on {os.environ.get('HARNESS_HOST', 'localhost')}: {reason}; exiting\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    finally:
        os._exit(1)


def _remove_socket_directory(endpoint: str) -> None:
    """Each child removes the socket it was given, and the directory once empty (the last one out)."""
    if not endpoint.startswith("ipc://"):
        return
    path = endpoint[len("ipc://"):]
    for remove in (os.unlink, os.rmdir):
        try:
            remove(path)
        except OSError:
            return
        path = os.path.dirname(path)
