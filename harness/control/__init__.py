"""The control plane: how the parent and its children find and talk to each other.

Owns starting a child's process (``spawn``), where children reach the parent (``endpoint``: ipc on one
machine, TCP across hosts), the socket the API thread and the heartbeat thread share (``link``),
framing with HMAC signatures (``wire``) and start-up timelines (``timeline``).

Never imports torch, CUDA or anything of training: the parent supervises without them, and a
child's control plane must work before its first import of torch has finished.
"""
from . import endpoint, link, spawn, timeline, wire

__all__ = ["endpoint", "link", "spawn", "timeline", "wire"]
