"""The control plane: how the parent and its children find, talk to and watch each other.

What is not the fork-and-join API (harness/parent.py, harness/child.py) but makes it work:

* ``spawn``: starting a child's process, its environment, the parent's record of it, the warm spare;
* ``endpoint``: where children reach the parent (ipc on one machine, TCP across hosts, CURVE);
* ``link``: the socket the API thread and the housekeeping thread share; ``wire``: framing + HMAC;
* ``supervise``: the parent's watch over a group (deaths, heartbeats, errors, abort, stop);
* ``mailbox``: what the children send, sorted for the group's verbs; exchanges meet there;
* ``replace``: healing, a new child (the spare or a fresh one) in a dead rank's place;
* ``serve``: a child's serve loop and the wire protocol; ``lifeline``: a child exits when its parent is gone;
* ``prefixed``: a child's stdout, each line begun with its rank (the parent prefixes its stderr);
* ``errors``: ChildError, ChildFailed (parent side) and PeerFailed (child side);
* ``timeline``: start-up timelines.

Never imports torch, CUDA or anything of training: the parent supervises without them, and a
child's control plane must work before its first import of torch has finished.
"""
from . import endpoint, errors, lifeline, link, mailbox, prefixed, replace, serve, spawn, supervise, timeline, wire

__all__ = ["endpoint", "errors", "lifeline", "link", "mailbox", "prefixed", "replace", "serve", "spawn",
           "supervise", "timeline", "wire"]
