"""Training: the worker's loop (``loop``), the step (``step``: eager, graphed or compiled), optimizers
(``optim``, ``ccnesterov``), learning-rate schedules (``schedule``) and the run's metrics (``metrics``).

Imports the collectives, the data pipeline and resilience; never the control plane's internals
(it talks to the parent through the ``Context`` a child is given). The modules are imported where
used: the parent imports parts of this package before torch.
"""
__all__ = ["ccnesterov", "loop", "metrics", "optim", "schedule", "step"]
