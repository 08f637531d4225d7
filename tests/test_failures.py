"""Nothing hangs, nothing is left behind: real processes, real signals, CPU children."""
import os
import re
import signal
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from harness import ChildFailed, Parent
from harness.control.supervise import Supervisor
from tests.helpers.processes import alive, kill_quietly, wait_gone


def _block_forever(ctx):
    ctx.yield_()
    ctx.receive()


@pytest.mark.parametrize("blocked_in", ["join", "receive", "wait"])
def test_sigkilled_child_raises_childfailed_quickly_and_stops_the_rest(blocked_in):
    def busy(ctx):
        if blocked_in == "join":
            if ctx.rank == 1:     # the victim never yields: had it yielded before the kill, join would succeed
                import time
                time.sleep(600)
            ctx.yield_()
        elif blocked_in == "receive":
            ctx.send("first")
            import time
            time.sleep(600)
        else:
            import time
            time.sleep(600)

    with Parent() as parent:
        kids = parent.fork(3)
        kids.exec(busy)
        pids = kids.pids
        if blocked_in == "receive":
            kids.receive()
        victim = pids[1]
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(ChildFailed) as info:        # not a hang: that would end in pytest's timeout
            getattr(kids, blocked_in)()
        assert info.value.rank == 1
        assert "SIGKILL" in str(info.value)
        assert wait_gone(pids, 5) == []       # the others were stopped too


def test_dead_child_reports_exit_status_and_stderr_tail():
    def crash(ctx):
        import os
        import sys
        if ctx.rank == 0:
            print("about to go down: disk on fire", file=sys.stderr, flush=True)
            os._exit(3)
        ctx.yield_()

    with Parent() as parent:
        kids = parent.fork(2)
        kids.exec(crash)
        with pytest.raises(ChildFailed) as info:
            kids.join()
    assert info.value.rank == 0
    assert "exited with status 3" in str(info.value)
    assert any("disk on fire" in line for line in info.value.stderr_tail)


def test_frozen_child_is_detected_by_missing_heartbeats():
    with Parent(heartbeat_timeout=3.0) as parent:
        kids = parent.fork(2)
        kids.exec(_block_forever)
        pids = kids.pids
        os.kill(pids[0], signal.SIGSTOP)
        try:
            with pytest.raises(ChildFailed, match="stopped responding") as info:
                kids.join()
        finally:
            kill_quietly(pids[0], signal.SIGCONT)
        silent = re.search(r"no heartbeat for ([\d.]+) s", str(info.value))
        assert silent and float(silent[1]) >= 3.0, str(info.value)     # not before the heartbeat timeout
        assert info.value.rank == 0
    assert wait_gone(pids, 5) == []


def test_children_exit_when_the_parent_is_killed(tmp_path):
    script = textwrap.dedent("""
        import sys, time
        from harness import Parent
        parent = Parent()
        kids = parent.fork(2)
        kids.exec(lambda ctx: ctx.yield_())
        print(parent._dir, *kids.pids, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        directory, *pids = proc.stdout.readline().split()
        pids = [int(p) for p in pids]
        assert len(pids) == 2 and all(alive(p) for p in pids) and os.path.isdir(directory)
        proc.kill()
        proc.wait()
        assert wait_gone(pids, 10) == []
        assert not os.path.exists(directory)      # the children removed the dead parent's sockets
    finally:
        proc.kill()


def test_a_silent_rank_is_heard_again_only_once_its_worker_talks_not_when_a_replacement_starts():
    """A rank silent for a third of the heartbeat timeout is named; its replacement, still starting (on a host
    that may still be cut off), says nothing of it; the replacement ready and heard is "heard again"."""
    told = []
    supervisor = Supervisor(None, heartbeat_timeout=3.0, heal=True, remote=True)
    supervisor.on_silent = lambda rank, seconds: told.append((rank, seconds))
    silent = SimpleNamespace(rank=1, connected=True, ready=True)
    supervisor._note_silence(silent, 2.0)
    replacement = SimpleNamespace(rank=1, connected=False, ready=False)
    supervisor._note_silence(replacement, 0.0)
    assert told == [(1, 2.0)]
    replacement.connected = replacement.ready = True
    supervisor._note_silence(replacement, 0.1)
    assert told == [(1, 2.0), (1, None)]


def test_no_child_remains_after_with_block_exits_normally_or_by_exception():
    with Parent() as parent:
        kids = parent.fork(2)
        kids.exec(_block_forever)          # still busy when the block ends
        busy_pids = kids.pids
    assert wait_gone(busy_pids, 0.1) == []

    with pytest.raises(ZeroDivisionError):
        with Parent() as parent:
            kids = parent.fork(2)
            kids.exec(_block_forever)
            pids = kids.pids
            1 / 0
    assert wait_gone(pids, 0.1) == []


def test_unresponsive_child_is_killed_on_exit():
    def ignore_stop(ctx):
        import time
        while True:
            time.sleep(1)      # never returns to the serve loop, so never honours "stop"

    with Parent() as parent:       # its exit must not wait on the child: a hang ends in pytest's timeout
        kids = parent.fork(1)
        kids.exec(ignore_stop)
        pids = kids.pids
    assert wait_gone(pids, 0.1) == []


def test_a_child_that_never_connects_fails_the_first_exec_naming_the_start_timeout(tmp_path, monkeypatch):
    """fork returns at once; the first exec waits for the children to connect, and one that has not
    within START_TIMEOUT (here its zygote is still importing a slow preload) fails the group."""
    import harness.control.supervise as supervise
    monkeypatch.setattr(supervise, "START_TIMEOUT", 1.0)
    (tmp_path / "slow_preload.py").write_text("import time\ntime.sleep(30)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with Parent() as parent:
        kids = parent.fork(2, preload=["slow_preload"])
        with pytest.raises(ChildFailed, match=r"did not connect within 1 s"):
            kids.exec(_block_forever)
