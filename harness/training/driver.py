"""Run a TrainConfig from the parent: start the workers, check, train, show progress.

This is Train.py's body and the Python API (``harness.training.run``). The workers start as soon as
it is known where they run; the parent checks the other fields meanwhile, and rank 0 checks the files
and the model as its first exec (harness/training/checks.py), so a bad input still fails before any
worker trains. The parent imports no torch, so its CPU goes to the workers' start; only --mode async makes it
(its parameter server and the checkpoints it writes), in a thread beside rank 0's checks.
A worker that dies or hangs is healed in place or restarts the group from the last checkpoint,
``max_restarts`` times in all (harness/resilience/recovery.py).
Started by an engine on several nodes, node 0 runs this with the nodes' agents as its launcher
(harness/training/nodes.py).
"""
from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from harness.control import timeline
from harness.launch.cluster import detect
from harness.launch.launchers import Launcher, make_launcher
from harness.parent import ChildError, ChildFailed, Children, Parent
from harness.resilience.interrupt import Interrupts
from harness.resilience.lock import InUse, hold
from harness.resilience.recovery import Recovery, restart_record, spend
from harness.training.checks import check_fields, check_flags, check_inputs_in, check_outputs, plan_workers, trained
from harness.training.config import ConfigError, TrainConfig
from harness.training.imports import import_meanwhile
from harness.training.metrics import MetricsLog, import_plotting_meanwhile, plot_metrics, read_metrics
from harness.training.nodes import nodes
from harness.training.progress import Progress, describe_recovery

SERVER_IMPORTS = ("harness.training.build",)     # --mode async: the parameter server the parent serves
# torch._dynamo: what the first optimizer a process builds imports (about 1.8 s of a CPU worker's start).
WORKER_IMPORTS = ("harness.training.loop", "harness.checkout.datasets", "harness.checkout.models", "torch._dynamo")


class Diverged(RuntimeError):
    """The loss or the parameters stopped being finite; the run stopped without saving them."""


class CheckFailed(ChildError):
    """The user's code raised while rank 0 checked the inputs (opening the data, building the model), before
    anything trained; carries the child's traceback as ChildError does."""


# What a worker raises about the data with a message that names the file and the fix: said alone, no traceback
DATA_ERRORS = ("DataError", "SampleError", "TooManyBadSamples")


def raised(error: ChildError | Diverged) -> str:
    """Train.py's line for training code that raised: rank 0's checks, the training, or the loss diverging."""
    if not isinstance(error, ChildError):
        return str(error)
    said = error.message if error.raised.rpartition(".")[2] in DATA_ERRORS else str(error)
    return ("checking the inputs failed: " if isinstance(error, CheckFailed) else "training failed: ") + said


def run(config: TrainConfig, *, interrupts: Interrupts | None = None, marks: dict | None = None) -> list[dict]:
    """Check ``config``, train it on its workers and return each worker's summary (``rank``, ``step``,
    ``epoch``, ``checksum`` of the final parameters, ``interrupted``: the signal that stopped it, if any).
    Writes the checkpoint (``config.save``) and the log (``config.log_dir``) as Train.py does.

    Raises ``ConfigError`` for bad input (before any worker trains), ``ChildError`` for an exception in
    a worker, ``ChildFailed``/``GaveUp`` when workers died more often than ``config.max_restarts``,
    ``Diverged`` when the loss stopped being finite (the last good checkpoint is kept).
    ``interrupts``: SIGINT/SIGTERM handlers to tell about the workers (Train.py's); ``marks``: the
    start-up timeline so far."""
    marks = marks if marks is not None else timeline.start("imported")
    check_fields(config)
    if config.resume and not config.inherited:
        raise ConfigError(f"TrainConfig(resume={config.resume!r}) trains with this config's own fields, not the saved "
                          f"run's; make it with TrainConfig.resuming({config.resume!r}, **changes) to continue that "
                          "run with your changes over it, as --resume does")
    with nodes(config) as agents, hosts_launcher(config, agents) as launcher:
        gpus, config = plan_workers(config, launcher)
        check_outputs(config)
        with contextlib.ExitStack() as outputs, contextlib.ExitStack() as group:
            config, kids, failed = checked_group(config, gpus, launcher, marks, group)
            outputs.enter_context(own_outputs(config))      # once checked: a refused run makes no folder
            print(f"training {config.model} on {config.dataset} with {config.workers} workers on "
                  f"{where(config, gpus, kids, launcher)}, mode {config.mode}")
            timeline.mark(marks, "checked")
            if config.plot:
                import_plotting_meanwhile()
            results = train(config, gpus, marks, interrupts, started=kids, launcher=launcher, failed_checks=failed)
        if agents is not None:        # the other nodes end as this one does
            agents.close(128 + results[0]["interrupted"] if results[0]["interrupted"] else 0)
        return results


@contextlib.contextmanager
def hosts_launcher(config: TrainConfig, agents: Launcher | None) -> Iterator[Launcher | None]:
    """The launcher every group of the run starts its workers with: the node ``agents`` an engine started, else
    for --launcher ssh or slurm one made here and released at the run's end, so that a group that replaces a
    failed one finds each host's session, and the zygote that imported torch there, still up (a host that was
    lost gets a new session); None on this machine, whose zygotes outlive the run anyway."""
    if agents is not None or config.launcher == "local":
        yield agents
        return
    try:
        launcher = make_launcher(config.launcher, config.hosts, config.hostfile)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    try:
        yield launcher
    finally:
        launcher.release()


def checked_group(config: TrainConfig, gpus: list[int], launcher: Launcher | None, marks: dict,
                  group: contextlib.ExitStack) -> tuple[TrainConfig, Children, list[dict]]:
    """A group of workers (entered into ``group``), the config checked (its flags here while the workers start,
    the rest by their rank 0) and the "restart" records of the groups that failed first. A worker that dies or
    hangs during the checks, before anything trained, costs one of --max-restarts, as it would later (a "restart"
    record ``"during": "checks"``, never healed in place): a new group checks again. The records wait for the
    run's lock (``train`` logs them): until then the log folder may be another run's."""
    flags, failed = None, []
    while True:
        with contextlib.ExitStack() as attempt:
            kids = attempt.enter_context(workers(config, gpus, launcher))
            timeline.mark(marks, "forked")
            if flags is None:
                import_server_meanwhile(config)
            flags = flags or check_flags(config, gpus)
            try:
                checked = checked_by(kids, flags)
            except ChildFailed as failure:
                used = spend(failure, len(failed), config.max_restarts)
                failed.append({"time": time.time(), **restart_record(failure, used, config.max_restarts, config.resume),
                               "during": "checks", **({"not_healed": "it came while rank 0 checked the inputs"}
                                                      if config.heal_in_place else {})})
                print(describe_recovery(failed[-1]))
                continue
            group.enter_context(attempt.pop_all())
            return checked, kids, failed


def checked_by(kids: Children, config: TrainConfig) -> TrainConfig:
    """``config`` with the checks that read files and build the model made by ``kids``' rank 0
    (``check_inputs_in``); ConfigError if one failed."""
    kids.exec(check_inputs_in, config)
    try:
        checked = kids.wait()[0]
    except ChildError as e:
        raise CheckFailed(e.rank, e.traceback) from None
    if isinstance(checked, str):
        raise ConfigError(checked)
    return checked


@contextlib.contextmanager
def own_outputs(config: TrainConfig) -> Iterator[None]:
    """This run's lock on its checkpoint and log folder (harness/resilience/lock.py), for its whole life: held
    until its last group has stopped."""
    try:
        with hold({"--save": config.save}, {"--log-dir": config.log_dir}):
            yield
    except (InUse, OSError) as e:
        raise ConfigError(str(e)) from None


def announce(config: TrainConfig, log: MetricsLog) -> None:
    """The log's "run" record, which begins this run's part of a log that earlier runs in the folder wrote to (a
    fresh run's plot draws its own records alone: metrics.curves), and a line where a fresh run will replace an
    earlier run's checkpoint. Once the checks passed (``train``): a run they refuse trains nothing and replaces
    nothing."""
    log.write({"time": time.time(), "event": "run", "resume": config.resume})
    if config.save and not config.resume and Path(config.save).exists():
        print(f"{config.save} holds an earlier run: this run replaces it when it first saves (--resume "
              f"{config.save} would continue it; --save another path keeps it)")


def where(config: TrainConfig, gpus: list[int], kids: Children, launcher: Launcher | None = None) -> str:
    shared = f", {config.workers_per_gpu} per GPU" if gpus and config.workers_per_gpu > 1 else ""
    if launcher is not None or config.launcher != "local":
        return (f"{len(kids.hosts)} hosts ({config.launcher if config.launcher != 'local' else 'node agents'}), "
                + ("GPUs " + ",".join(map(str, gpus)) if gpus else "CPU") + " on each" + shared)
    return f"{len(gpus)} GPU(s)" + shared if gpus else f"{config.workers} CPU workers"


@contextlib.contextmanager
def mps_for(config: TrainConfig) -> Iterator[dict[str, str]]:
    """With ``mps``, a private MPS daemon for the run; yields the environment that points workers at it."""
    from harness.launch.mps import active_mps_env, start_mps
    if not config.mps:
        found = active_mps_env()
        if found:
            print(f"using the MPS daemon your environment points at ({found['CUDA_MPS_PIPE_DIRECTORY']})")
        yield {}
        return
    try:
        daemon = start_mps(Path(config.log_dir) / "mps")
    except (RuntimeError, ValueError) as e:
        raise ConfigError(f"--mps: {e}") from None
    with daemon:
        print(f"started a private MPS daemon (log: {daemon.log_dir})")
        yield daemon.env


@contextlib.contextmanager
def workers(config: TrainConfig, gpus: list[int], launcher: Launcher | None = None) -> Iterator[Children]:
    """A group of training workers, stopped on exit. They import what training needs as soon as they
    start, so a group started before the parent's own imports and checks does that work alongside
    them. ``launcher``: the run's (``hosts_launcher``), else ``config.launcher`` names one. With ``mps`` the
    private daemon starts first and outlives the workers: MPS only quits once its clients are gone. With
    ``heal_in_place`` a dead worker does not stop the group (--mode async: nor abort the others, which share
    no collective)."""
    with mps_for(config) as daemon_env, Parent(heartbeat_timeout=config.heartbeat_timeout) as parent:
        try:
            group = parent.fork(config.workers, gpus=gpus or None, env=daemon_env, preload=WORKER_IMPORTS,
                                heal=config.heal_in_place, launcher=launcher or config.launcher, hosts=config.hosts,
                                hostfile=config.hostfile, address=config.control_address, encrypt=config.encrypt,
                                independent=config.mode == "async")
        except ValueError as e:         # e.g. no address to listen on for the hosts
            raise ConfigError(str(e)) from None
        yield group


def resumes(config: TrainConfig) -> str:
    """What a run the engine restarted goes on from, for its start line."""
    if config.resume:
        return f"; resuming {config.resume}"
    if config.save:
        return f"; nothing to resume ({config.save} was not written before the restart): starting over"
    return "; nothing to resume (no --save): starting over"


def train(config: TrainConfig, gpus: list[int], marks: dict | None = None, interrupts: Interrupts | None = None,
          started: Children | None = None, launcher: Launcher | None = None,
          failed_checks: Sequence[dict] = ()) -> list[dict]:
    """Train a checked config (``checks.check`` has filled in ``samples``) on ``started``, the workers
    already forked for it, or on a group forked here (by ``launcher``, the run's, if given); every
    restart forks a new group. ``marks``: the start-up timeline so far (by default it starts now, the
    checks done). ``failed_checks``: the "restart" records of groups that failed during the checks, each of which
    spent one of --max-restarts (``checked_group``)."""
    marks = marks if marks is not None else timeline.start("checked")
    steps_per_epoch = config.steps_per_epoch()
    log = MetricsLog(config.log_dir, tensorboard=config.tensorboard)
    announce(config, log)
    for record in failed_checks:
        log.write(record)
    start = launcher.cluster if launcher is not None and launcher.cluster else detect(os.environ, config.cluster)
    if start is not None:       # plan_workers checked it (and resumed after the engine's restart)
        print(start.describe() + (resumes(config) if start.restart_count else ""))
        log.write({"time": time.time(), **start.record()})
    progress = Progress(config, steps_per_epoch, log)
    recovery = Recovery(config.max_restarts, config.heal_in_place, config.resume, lambda: progress.saved,
                        progress.handle, stopping=lambda: interrupts.signum if interrupts is not None else None,
                        used=len(failed_checks))
    first = iter([started] if started is not None else [])    # a failed group is stopped for good

    def attempt(resume: str | None) -> list[dict]:
        attempt_config = config.replace(resume=resume)
        kids = next(first, None)
        if kids is not None:
            return run_group(attempt_config, kids, marks, interrupts, progress, recovery, steps_per_epoch)
        with workers(attempt_config, gpus, launcher) as kids:
            marks.setdefault("forked", time.time())
            return run_group(attempt_config, kids, marks, interrupts, progress, recovery, steps_per_epoch)

    try:
        results = ended_anyway(config, recovery.run(attempt), progress.last_saved)
        log.write({"time": time.time(), "event": "startup", "parent": marks,
                   "workers": [r["marks"] for r in results]})
    finally:
        progress.close()
        log.close()
    plot = plot_metrics(read_metrics(log.path), Path(config.log_dir) / "metrics.png") if config.plot else None
    print(f"log: {log.path}" + (f", plot: {plot}" if plot else "")
          + (f", checkpoint: {progress.saved}" if progress.saved else ""))     # this run's, not an earlier one's
    if results[0]["diverged"]:
        good = progress.saved or config.resume
        raise Diverged(f"training diverged: {results[0]['diverged']}; "
                       + (f"the last good checkpoint is {good}" if good else "no checkpoint was saved")
                       + "; lower --lr, or add --clip-grad or --warmup-steps")
    return results


def ended_anyway(config: TrainConfig, results: list[dict], saved: dict | None) -> list[dict]:
    """A signal that stopped the run at its last updates stopped nothing: the checkpoint this run wrote last
    (``saved``, its record; not a file an earlier run left at --save) holds the whole run, and a --resume would
    find nothing left to train. Such a run is finished (Train.py exits 0), not stopped."""
    signum = results[0]["interrupted"]
    if not signum or saved is None:
        return results
    if config.mode == "async":      # every worker's updates count, which only the file holds (torch: the async
        from harness.resilience.checkpoint import load_checkpoint      # parent's server imported it already)
        saved = load_checkpoint(saved["path"])
    done, total, every = trained(config, saved)
    if done < total:        # async mode: rank 0's own update is not the run's (its budget is every worker's)
        return [{**result, "trained": f"{done} of {total} updates{every}"} for result in results] if every else results
    print(f"{signal.Signals(signum).name} came as the run ended: it trained its {total} updates{every}")
    return [{**result, "interrupted": None} for result in results]


def run_group(config: TrainConfig, kids: Children, marks: dict, interrupts: Interrupts | None,
              progress: Progress, recovery: Recovery, steps_per_epoch: int) -> list[dict]:
    """One group of workers from start (or ``config.resume``) to the end of the run, healed in
    place when a worker dies, if it may be; otherwise the failure ends the group (stopped). --mode async:
    the parent serves the parameter server (its records, outer_sync and the workers' validations, logged
    as rank 0's records come, before them), which a dead worker's replacement rejoins."""
    server = async_server(config, steps_per_epoch)
    if server is not None:
        from harness.resilience.gathered import GatheredCheckpoints
        kids.serve("server", server.handle)
        served = Served(server, progress, GatheredCheckpoints(config.save) if config.save else None,
                        lambda healed: {**recovery.healed(healed), "pids": kids.pids})
    if interrupts is not None:
        interrupts.watch(kids)
    kids.watch_silence(progress.silent)
    try:
        kids.exec("harness.training.loop:train_worker", config)
        progress.handle({"event": "workers", "pids": kids.pids, "hosts": kids.hosts})
        while True:
            try:
                record = kids[0].receive()
            except ChildFailed as failure:
                if server is not None:
                    served.log()        # a replacement that rejoined since ended its heal: this failure is another
                lost = server is not None and recovery.heals_in_place     # --heal off: the group restarts anyway
                recovery.heal(kids, failure, unhealable=server.lose(failure.rank) if lost else None)
                continue
            if record["event"] == "healed":
                record = {**recovery.healed(record), "pids": kids.pids}
            if server is not None:
                served.log()
            progress.handle(record)
            if record["event"] == "first_step":
                timeline.mark(marks, "first_step")
                restarted = recovery.restarted(record)
                if restarted is not None:
                    progress.handle(restarted)
            if record["event"] == "done":
                break
        return kids.wait()
    except ChildFailed:
        kids.stop(grace=1.0)        # a group forked to heal is not stopped by its failure
        raise
    finally:
        if server is not None:
            from harness.collectives.shared import SharedAreas
            served.log(everything=True)         # what the workers reported and saved last, also before an error
            if not kids.remote:                 # remote workers' areas are on their hosts; their pids are theirs
                SharedAreas.sweep(kids.pids)    # what a worker that died before its join left in /dev/shm


def import_server_meanwhile(config: TrainConfig) -> None:
    """--mode async: the parameter server's imports (torch) in a thread while rank 0 checks the inputs, rather than
    after the checks, when the workers would wait for them before they train."""
    if config.mode == "async":
        import_meanwhile(SERVER_IMPORTS, "import-server")


def async_server(config: TrainConfig, steps_per_epoch: int) -> Any:
    """--mode async: the parameter server the parent serves (it imports torch for it); None in other modes."""
    if config.mode != "async":
        return None
    from harness.training.build import make_server
    return make_server(config, steps_per_epoch)


class Served:
    """--mode async: what the parameter server took since the last ``log`` (outer_sync, the workers' validations and
    bad samples, a replacement's rejoin as ``recovered`` makes it the log's record, checkpoints whose parts are all
    in), logged, and those checkpoints written (harness/resilience/gathered.py; None: the run saves nothing); an
    outer_sync record once its worker has said how long it stood still for it."""

    def __init__(self, server: Any, progress: Progress, gathered: Any, recovered: Callable[[dict], dict]):
        self.server, self.progress, self.gathered, self.recovered = server, progress, gathered, recovered

    def log(self, everything: bool = False) -> None:
        """The records and checkpoints since the last call (``everything``: all, at the end, once written)."""
        for parts in self.server.checkpoints():
            self.gathered.write(parts)
        for served in self.server.drain(everything):
            self.progress.handle(self.recovered(served) if served["event"] == "healed" else served)
        for saved in self.gathered.records(everything) if self.gathered is not None else ():
            self.progress.handle(saved)
