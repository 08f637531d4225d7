"""Every frame is authenticated; a rogue peer's pickle is never unpickled."""
import logging
import os
import pickle
import time

import zmq

from harness import Parent


class _CreatesFile:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_rogue_peer_pickle_is_dropped_and_run_goes_on(tmp_path, caplog):
    target = tmp_path / "pwned"
    payload = pickle.dumps(("data", 1, _CreatesFile(str(target))))
    with Parent() as parent:
        kids = parent.fork(2)
        kids.exec(lambda ctx: ctx.yield_(ctx.rank))
        endpoint = kids._link.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        rogues = []
        for identity in (b"1", b"rogue"):             # impersonating a real child, and a stranger
            rogue = zmq.Context.instance().socket(zmq.DEALER)
            rogue.setsockopt(zmq.IDENTITY, identity)
            rogue.setsockopt(zmq.LINGER, 0)
            rogue.connect(endpoint)
            rogues.append(rogue)
        with caplog.at_level(logging.WARNING, logger="harness"):
            for rogue in rogues:
                rogue.send(b"\0" * 32 + payload)                  # a forged signature
                rogue.send(payload)                              # no signature at all
            deadline = time.monotonic() + 60                     # the stranger's two frames, dropped
            while dropped(caplog) < 2:
                assert time.monotonic() < deadline, "the rogue frames were not reported as dropped"
                time.sleep(0.01)
            assert kids.join("go") == [0, 1]
            assert kids.wait() == ["go", "go"]
        for rogue in rogues:
            rogue.close()
    assert not target.exists()


def dropped(caplog) -> int:
    """How many frame sets the parent logged as dropped unread."""
    return sum("not unpickled" in r.getMessage() for r in list(caplog.records))


def test_socket_directory_is_private():
    with Parent() as parent:
        kids = parent.fork(1)
        endpoint = kids._link.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        assert endpoint.startswith("ipc://")
        directory = os.path.dirname(endpoint.removeprefix("ipc://"))
        assert os.stat(directory).st_mode & 0o777 == 0o700


def test_key_is_not_on_the_command_line_and_not_inherited_further():
    def report(ctx):
        import os
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
            return f.read(), "HARNESS_KEY" in os.environ

    with Parent() as parent:
        kids = parent.fork(1)
        kids.exec(report)
        [(cmdline, key_in_env)] = kids.wait()
    assert parent._key.hex().encode() not in cmdline
    assert not key_in_env
