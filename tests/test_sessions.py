"""Host sessions (harness/launch/session.py): one process on each remote host forks that host's children
from a zygote of its own. Here the hosts are this machine's names for itself and "ssh" runs the ssh
launcher's command here, so the session's own behaviour is tested alone: the ssh and Slurm runs on
namespaced hosts are tests/test_hosts.py's."""
import json
import os
import signal
import sys
import textwrap
import time

import pytest

from harness import ChildFailed, Parent
from harness.launch import session
from harness.launch.launchers import Host, Ssh
from tests.helpers.processes import alive, wait_gone


@pytest.fixture
def here(tmp_path):
    """An ssh launcher on this machine: ``here(("127.0.0.1", 2), ...)``; its "ssh" runs the remote command here."""
    ssh = tmp_path / "ssh-here"
    ssh.write_text('#!/bin/sh\n# ssh -T -o BatchMode=yes HOST COMMAND\nshift 4\nexec sh -c "$1"\n')
    ssh.chmod(0o755)
    made = []

    def launcher(*hosts: tuple[str, int]) -> Ssh:
        made.append(Ssh([Host(name, slots) for name, slots in hosts], command=str(ssh)))
        return made[-1]
    yield launcher
    for each in made:
        each.release()


def _parent_and_pid(ctx):
    return os.getppid(), os.getpid()


def _sleep(ctx):
    time.sleep(600)


def _sessions(launcher: Ssh) -> dict:
    return launcher._sessions


def _only(launcher: Ssh) -> session.Session:
    (live,) = launcher._sessions.values()
    return live


def test_a_host_s_children_are_forked_by_one_session_that_imports_their_preloads_once(here, tmp_path, monkeypatch):
    (tmp_path / "counted.py").write_text(textwrap.dedent(f"""
        import os
        with open({str(tmp_path / 'imports')!r}, "a") as f:
            f.write(f"{{os.getpid()}}\\n")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    launcher = here(("127.0.0.1", 4))
    with Parent(heartbeat_timeout=10.0) as parent:
        kids = parent.fork(4, launcher=launcher, preload=("counted",))
        kids.exec(_parent_and_pid)
        found = kids.wait()
        assert [pid for _, pid in found] == kids.pids          # a remote child's pid is its own, not a client's
        assert len({ppid for ppid, _ in found}) == 1            # one zygote forked them all
        assert len(_sessions(launcher)) == 1
    assert (tmp_path / "imports").read_text().split() == [str(found[0][0])]     # imported once, by that zygote
    assert wait_gone(kids.pids, 10.0) == []


def test_a_session_whose_stdin_ends_ends_its_children_and_itself(here):
    """As when sshd closes the connection, or the parent's end of the pipe closes with the parent."""
    launcher = here(("127.0.0.1", 2))
    with Parent(heartbeat_timeout=30.0) as parent:
        kids = parent.fork(2, launcher=launcher, heal=True)
        kids.exec(_sleep)
        pids = kids.pids
        live = _only(launcher)
        live.process.stdin.close()
        assert live.process.wait(timeout=15) is not None
        assert wait_gone(pids, 15.0) == []
        with pytest.raises(ChildFailed) as failed:
            kids.wait()
    assert "host 127.0.0.1 is lost: its session ended" in str(failed.value)


def test_a_silent_session_is_lost_with_its_children_and_the_next_child_on_its_host_starts_a_new_one(here):
    launcher = here(("127.0.0.1", 2))
    with Parent(heartbeat_timeout=3.0) as parent:
        kids = parent.fork(2, launcher=launcher)
        kids.exec(_sleep)
        pids = kids.pids
        stopped = _only(launcher)
        os.kill(stopped.process.pid, signal.SIGSTOP)       # the host's session falls silent
        with pytest.raises(ChildFailed) as failed:
            kids.wait()
        assert "no heartbeat from its session" in str(failed.value), failed.value
        assert "its host's session was lost" in str(failed.value)      # exit status 255, explained
        assert wait_gone([stopped.process.pid, *pids], 15.0) == []       # killed, and its children ended with it

        again = parent.fork(2, launcher=launcher)
        again.exec(_parent_and_pid)
        assert len(again.wait()) == 2
        assert _only(launcher) is not stopped


def test_a_host_without_the_python_environment_fails_its_children_naming_the_path(here, monkeypatch):
    launcher = here(("127.0.0.1", 2))
    monkeypatch.setattr(sys, "executable", "/nonexistent/python3")      # what the session's command runs
    with Parent(heartbeat_timeout=10.0) as parent:
        kids = parent.fork(2, launcher=launcher)
        with pytest.raises(ChildFailed) as failed:
            kids.exec(_parent_and_pid)
            kids.wait()
    assert "exited with status 127" in str(failed.value)
    assert "harness: /nonexistent/python3 is missing on 127.0.0.1: every host needs the same Python" in str(failed.value)


def test_a_session_outlives_sigterm_and_sigint_which_its_workers_decide_on(here):
    """Slurm signals every process of a step (a time limit, scancel): the session must not die of it, or its
    workers would die with it before they could stop at an update and save."""
    launcher = here(("127.0.0.1", 2))
    with Parent(heartbeat_timeout=10.0) as parent:
        kids = parent.fork(2, launcher=launcher)
        kids.exec(_parent_and_pid)
        kids.wait()
        live = _only(launcher)
        for signum in (signal.SIGTERM, signal.SIGINT):
            os.kill(live.process.pid, signum)
        time.sleep(1.0)
        kids.exec(_parent_and_pid)
        assert len(kids.wait()) == 2 and live.process.poll() is None and live.lost is None


def test_a_worker_its_host_cannot_start_fails_alone_and_the_session_serves_on(here):
    """GPU 0 of a host without GPUs: the request fails on the host, as that worker's exit, not the session's."""
    launcher = here(("127.0.0.1", 2))
    with Parent(heartbeat_timeout=10.0) as parent:
        with pytest.raises(ChildFailed) as failed:
            kids = parent.fork(2, gpus="all", launcher=launcher)
            kids.exec(_parent_and_pid)
            kids.wait()
        assert "exited with status 1" in str(failed.value)
        assert "harness: the host could not start this worker: IndexError" in str(failed.value)
        again = parent.fork(2, launcher=launcher)
        again.exec(_parent_and_pid)
        assert len(again.wait()) == 2 and len(_sessions(launcher)) == 1


def test_a_session_slow_to_start_is_not_lost_for_it(here, tmp_path):
    """ssh's connection or srun's step may take longer than the heartbeat timeout before the session says a word."""
    slow = tmp_path / "ssh-slowly"
    slow.write_text('#!/bin/sh\nsleep 3\nshift 4\nexec sh -c "$1"\n')
    slow.chmod(0o755)
    launcher = Ssh([Host("127.0.0.1", 1)], command=str(slow))
    try:
        with Parent(heartbeat_timeout=1.5) as parent:
            kids = parent.fork(1, launcher=launcher)
            kids.exec(_parent_and_pid)
            assert len(kids.wait()) == 1
    finally:
        launcher.release()


def test_release_ends_every_session_and_its_zygote(here):
    launcher = here(("127.0.0.1", 1), ("localhost", 1))
    with Parent(heartbeat_timeout=10.0) as parent:
        kids = parent.fork(2, launcher=launcher)
        kids.exec(_parent_and_pid)
        zygotes = [ppid for ppid, _ in kids.wait()]
        kids.stop()
        sessions = [s.process.pid for s in _sessions(launcher).values()]
        assert len(set(zygotes)) == 2 and all(alive(pid) for pid in [*zygotes, *sessions])     # kept for the launcher
        launcher.release()
        assert wait_gone([*zygotes, *sessions], 10.0) == []
        assert _sessions(launcher) == {}


@pytest.mark.parametrize("line", [b"plain\n", b"\xff\xfe not utf-8\n", b""])
def test_a_stderr_line_crosses_the_channel_byte_for_byte_on_one_line(line):
    encoded = session.encode(("stderr", (3, line)))
    assert encoded.count(b"\n") == 1 and encoded.endswith(b"\n")
    assert session.decode(encoded) == ("stderr", (3, line))
    assert session.decode(session.encode(("start", (1, {"HARNESS_KEY": "ab"})))) == ("start", [1, {"HARNESS_KEY": "ab"}])


def test_a_run_s_restarted_group_is_forked_by_the_session_its_first_group_started(tmp_path, monkeypatch):
    """Train.py --launcher ssh keeps one launcher for the whole run: the group that replaces a failed one (here
    rank 0 dies while it checks the inputs, which costs one of --max-restarts) finds its host's session, and the
    zygote that imported torch there, still up. Each ssh connection is one line of the log."""
    # imported here, not by the module, whose functions the other tests' children unpickle: importing torch for
    # that would hold a child's heartbeat back past those tests' short timeouts
    import Train
    from harness.training import run
    from harness.training.metrics import read_metrics
    from tests.helpers import slow_model
    connections = tmp_path / "connections"
    ssh = tmp_path / "ssh-logged"
    ssh.write_text(f'#!/bin/sh\necho "$4" >> {connections}\nshift 4\nexec sh -c "$1"\n')
    ssh.chmod(0o755)
    monkeypatch.setenv("HARNESS_SSH", str(ssh))
    options = json.dumps({"delay": 0.0, "die_once": str(tmp_path / "died")})
    flags = ["--launcher", "ssh", "--hosts", "127.0.0.1:2", "--model", slow_model.SPEC, "--model-options", options,
             "--max-steps", "4", "--max-restarts", "1", "--heartbeat-timeout", "10", "--save", str(tmp_path / "m.pt"),
             "--log-dir", str(tmp_path / "logs")]
    results = run(Train.parse_args(flags))
    assert [r["step"] for r in results] == [4, 4] and (tmp_path / "died").exists()
    restarts = [r for r in read_metrics(tmp_path / "logs" / "metrics.jsonl") if r["event"] == "restart"]
    assert [r["during"] for r in restarts] == ["checks"]
    assert connections.read_text().split() == ["127.0.0.1"]
