"""Trust between the nodes of a run an engine started: a key every node already has.

The parent cannot hand its per-run key to processes it did not start, so every node reads one
pre-shared key: the file ``HARNESS_KEY_FILE`` names (a Kubernetes Secret mounted as a file, a file on the
shared home), or else the variable ``HARNESS_KEY`` (the job script's environment), never argv, which every
user of a host can read with ``ps``. ``HARNESS_KEY`` is also the variable by which a child gets the run's
own key (harness/control/spawn.py): the child's value always replaces the inherited one, so a node's
pre-shared ``HARNESS_KEY`` never reaches a child, and the zygote drops every ``HARNESS_`` variable.

From that key come, by HMAC with a fixed label each (so none can be told from another):

* the signing key of the link between the parent and the node agents (frames signed by
  harness/control/wire.py as the children's are);
* a CurveZMQ keypair for the parent's end and one for the agents', so that the link is encrypted too:
  the per-run key and the children's environments travel over it. An agent with another key cannot
  complete the handshake, and the parent's answers carry a signature only the same key makes.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import sys
from pathlib import Path
from typing import Mapping

import zmq
import zmq.utils.z85

MIN_KEY_CHARS = 32      # e.g. 16 random bytes as hex; token_hex(32) gives 64
HOW = ('make one with: (umask 077; python -c "import secrets; print(secrets.token_hex(32))" > harness.key); and give '
       'every node the same file: export HARNESS_KEY_FILE=$PWD/harness.key (or set HARNESS_KEY to its text)')


def preshared_key(env: Mapping[str, str]) -> bytes:
    """The key every node of the run shares, from the file $HARNESS_KEY_FILE names or $HARNESS_KEY; a
    ValueError naming the problem and how to make a key when there is none or it is too short."""
    path = env.get("HARNESS_KEY_FILE")
    if path:
        try:
            text = Path(path).read_text().strip()
        except OSError as error:
            raise ValueError(f"HARNESS_KEY_FILE={path}: {error.strerror}; {HOW}") from None
        where = f"HARNESS_KEY_FILE={path}"
        _warn_if_readable(path)
    else:
        text, where = env.get("HARNESS_KEY", "").strip(), "HARNESS_KEY"
        if not text:
            raise ValueError(f"a run over several nodes started by a cluster engine needs a key every node shares, "
                             f"and neither HARNESS_KEY_FILE nor HARNESS_KEY is set; {HOW}")
    if len(text) < MIN_KEY_CHARS:
        raise ValueError(f"{where} holds {len(text)} characters, fewer than {MIN_KEY_CHARS}: too easy to guess; {HOW}")
    return hashlib.sha256(text.encode()).digest()


def _warn_if_readable(path: str) -> None:
    """Say so where the key file is open to other users: whoever reads it can sign the frames that every node
    unpickles, that is, run code there. A warning, not a refusal: a Kubernetes Secret is mounted 0644 unless its
    volume says otherwise, and inside a pod nobody else may be there to read it."""
    mode = os.stat(path).st_mode & 0o777
    if mode & 0o077:
        print(f"harness: warning: HARNESS_KEY_FILE={path} can be read by other users (mode {mode:04o}), who could run "
              f"code on every node with it; chmod 600 {path} (a Kubernetes Secret: defaultMode: 0400)",
              file=sys.stderr, flush=True)


def derive(key: bytes, label: str) -> bytes:
    """A 32-byte key for one use (``label``) of the pre-shared ``key``."""
    return hmac.digest(key, f"harness node link: {label}".encode(), "sha256")


def curve_pair(key: bytes, side: str) -> tuple[bytes, bytes]:
    """The (public, secret) CurveZMQ keys of ``side`` ("parent" or "agent"), both z85, made from ``key``."""
    secret = zmq.utils.z85.encode(derive(key, f"curve {side}"))
    return zmq.curve_public(secret), secret


def link_socket(context: zmq.Context, key: bytes, side: str) -> zmq.Socket:
    """The parent's ROUTER (``side`` "parent") or an agent's DEALER ("agent"), encrypted with the keys
    ``key`` makes: only a node with the same key can talk to the other end."""
    if not zmq.has("curve"):
        raise ValueError("node agents need a pyzmq built with CurveZMQ (libsodium); the wheels from PyPI are")
    socket = context.socket(zmq.ROUTER if side == "parent" else zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    public, secret = curve_pair(key, side)
    socket.curve_publickey, socket.curve_secretkey = public, secret
    if side == "parent":
        socket.curve_server = True
        socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
    else:
        socket.curve_serverkey = curve_pair(key, "parent")[0]
    return socket


def forget_key() -> None:
    """Drop the pre-shared key's variables from this process's environment once read."""
    for name in ("HARNESS_KEY", "HARNESS_KEY_FILE"):
        os.environ.pop(name, None)
