"""Train one model on every worker: python Train.py --help

Defaults: an MLP on scikit-learn's bundled handwritten digits, on every GPU if there are GPUs,
otherwise on 2 CPU workers; the checkpoint goes to checkpoints/model.pt and the log (JSON lines
and a plot) to runs/. Every bad input is a one-line error before any worker trains.
Ctrl-C or SIGTERM: the workers stop within 8 updates and save a checkpoint that --resume continues
exactly; exit status 130 or 143. A second Ctrl-C stops at once.

The same run from Python: harness.training.run(TrainConfig(...)); the flags are TrainConfig's fields.
"""
from __future__ import annotations

import shlex
import signal
import sys

from harness import ChildError, ChildFailed
from harness.control import timeline
from harness.launch.agents import NodeLost
from harness.plugins import find_in_working_folder
from harness.resilience.interrupt import Interrupted, Interrupts, finished
from harness.resilience.recovery import GaveUp
from harness.training.config import ConfigError, TrainConfig
from harness.training.driver import Diverged, raised, run
from harness.training.nodes import exit_status, serve_node
from harness.training.flags import parse


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """The command line as a TrainConfig (not yet checked: ``run`` checks it)."""
    return parse(argv, __doc__)


def main(argv: list[str] | None = None) -> int:
    """Parse, check, train; the exit status: 0, 2 for bad input, 1 when training failed or diverged, 128 + the
    signal's number when SIGINT or SIGTERM stopped the run at an update (saved; --resume continues; 0 where the
    run trained its whole length all the same), and
    200 (RETRY_EXIT) when workers died past --max-restarts under a cluster engine, which may then restart
    the job: it resumes from its checkpoint. Under an engine that started it on several nodes, every node
    but node 0 serves node 0 as its node agent and exits with node 0's status."""
    marks = timeline.start("imported")
    with Interrupts() as caught:
        try:
            config = parse_args(argv)
            served = serve_node(config)
            if served is not None:
                return served
            results = run(config, interrupts=caught, marks=marks)
        except ConfigError as e:                    # a bad input, or the MPS daemon did not start
            print(f"Train.py: error: {e}", file=sys.stderr)
            return exit_status(e)
        except (ChildError, Diverged) as e:         # the training code raised: a restart would raise it again
            print(f"Train.py: {raised(e)}", file=sys.stderr)
            return exit_status(e)
        except (ChildFailed, GaveUp, NodeLost) as e:    # workers died: an engine that started us may start us again
            print(f"Train.py: training failed: {e}", file=sys.stderr)
            return exit_status(e, config.cluster)
        except Interrupted as e:
            print(f"Train.py: {e}; nothing saved since the last checkpoint", file=sys.stderr)
            return exit_status(e)
    signum = results[0]["interrupted"]
    if signum:
        saved = (f"saved {config.save}; continue with: python {shlex.quote(sys.argv[0])} --resume "
                 f"{shlex.quote(config.save)}" if config.save else "not saved (--save is empty)")
        together = f" ({results[0]['trained']})" if results[0].get("trained") else ""
        print(f"Train.py: {signal.Signals(signum).name}: stopped at epoch {results[0]['epoch']}, "
              f"update {results[0]['step']}{together}; {saved}", file=sys.stderr)
        return 128 + signum
    return 0


if __name__ == "__main__":
    find_in_working_folder()        # as a command only: a process that calls main() keeps its own path
    sys.exit(finished(main()))
