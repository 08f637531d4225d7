"""harness: a fork-and-join, multi-process, multi-GPU training harness for PyTorch.

The parent forks child workers and talks to them over ZeroMQ (cloudpickle, HMAC-signed frames);
children keep their model replicas in step with NCCL (or gloo on CPU) collectives.
"""
from . import checkout
from .control.errors import PeerFailed
from .parent import ChildError, ChildFailed, Children, Parent

checkout.install()      # the bare names `datasets` and `models` stay the user's; see checkout.py

__all__ = ["Parent", "Children", "ChildError", "ChildFailed", "Context", "PeerFailed"]


def __getattr__(name: str):
    # harness.child is also the children's entry point (python -m harness.child): importing it
    # here eagerly would make runpy warn in every child.
    if name == "Context":
        from .child import Context
        return Context
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
