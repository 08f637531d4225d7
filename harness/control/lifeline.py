"""A child's watch on its parent: a child whose parent is gone exits at once.

Nobody else would ever stop it, and it may hold a GPU. How a child notices depends on where it runs:

* its parent process is the parent itself, or the zygote that forked it for the parent
  (``HARNESS_PARENT_PID``): when ``getppid`` changes, it is gone (a zygote ends with its parent). A
  parent that was killed could not remove its private socket directory; its children do (each its
  socket, and the directory once empty);
* on another host its parent process is its host session's zygote (harness/launch/session.py), which
  a cut-off network does not end: the parent sends heartbeats too (harness/control/supervise.py), and
  a child that hears nothing for the heartbeat timeout exits.

The serve loop (harness/control/serve.py) calls ``Lifeline.check`` on every housekeeping tick and
``Lifeline.heard`` for every message from the parent.
"""
from __future__ import annotations

import os
import sys
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
