"""Surviving failure: checkpoints (atomic, written by a background ``saver``), Ctrl-C/SIGTERM as a
voted stop (``interrupt``), healing a dead rank in place (``heal``: the workers' side) and the
parent's choice between healing and restarting from the checkpoint (``recovery``).

Imports the collectives (a heal builds a new communicator) but never the training loop: the loop
calls these, not the other way round. The modules are imported where used (``checkpoint`` and
``heal`` import torch; the parent's ``interrupt``, ``recovery`` and ``saved_config``, which reads a checkpoint's
config for ``--resume``, must not).
"""
__all__ = ["checkpoint", "heal", "interrupt", "recovery", "saved_config", "saver"]
