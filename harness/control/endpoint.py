"""Where a group's children reach the parent: a Unix socket on one machine, TCP across machines.

Local groups use ``ipc://`` in the parent's private directory (mode 0700: no other user can connect).
A group on other hosts needs TCP. The parent binds to one address, never to every interface: the
one the user names (``--control-address``) or else its own address on the route to the first host
(its NodeAddr under Slurm), on a port the kernel picks. Every frame is HMAC-signed with the run's key either way (harness/control/wire.py),
so a peer without the key can neither send nor forge. ``encrypt`` adds CurveZMQ on top, for a network
others can listen on: the parent's socket is a CURVE server, and each child gets the server's public
key and a keypair of its own, all in its environment (which over ssh travels on stdin).
"""
from __future__ import annotations

from pathlib import Path

import zmq

from harness.launch.launchers import Launcher, address_toward


def bind(context: zmq.Context, launcher: Launcher, directory: Path, name: str, address: str | None = None,
         encrypt: bool = False) -> tuple[zmq.Socket, str, dict[str, str]]:
    """A ROUTER socket bound for the group; returns (socket, endpoint, what every child's environment needs)."""
    if encrypt and not launcher.remote:
        raise ValueError("encrypt=True is for children on other hosts (a local group talks over a private "
                         "Unix socket); use a remote launcher or drop encrypt")
    socket = context.socket(zmq.ROUTER)
    socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
    socket.setsockopt(zmq.LINGER, 0)
    env: dict[str, str] = {}
    if encrypt:
        if not zmq.has("curve"):
            raise ValueError("encrypt=True needs a pyzmq built with CurveZMQ (libsodium); the wheels from PyPI are")
        public, secret = zmq.curve_keypair()
        socket.curve_server = True
        socket.curve_secretkey = secret
        client_public, client_secret = zmq.curve_keypair()
        env = {"HARNESS_CURVE_SERVER": public.decode(), "HARNESS_CURVE_PUBLIC": client_public.decode(),
               "HARNESS_CURVE_SECRET": client_secret.decode()}
    if not launcher.remote:
        endpoint = f"ipc://{directory}/{name}"
        socket.bind(endpoint)
        return socket, endpoint, env
    host = address or address_toward(launcher.address_of(launcher.hosts[0].name))
    try:
        port = socket.bind_to_random_port(f"tcp://{host}")
    except zmq.ZMQError as error:
        socket.close()
        raise ValueError(f"cannot listen on {host} for the children ({error}); name an address of this "
                         "machine that the hosts reach with --control-address") from None
    return socket, f"tcp://{host}:{port}", env


def secure(socket: zmq.Socket, environ: dict[str, str]) -> None:
    """A child's side of ``encrypt``: make its socket a CURVE client of the parent's, if the group is encrypted."""
    if "HARNESS_CURVE_SERVER" in environ:
        socket.curve_serverkey = environ.pop("HARNESS_CURVE_SERVER").encode()
        socket.curve_publickey = environ.pop("HARNESS_CURVE_PUBLIC").encode()
        socket.curve_secretkey = environ.pop("HARNESS_CURVE_SECRET").encode()
