"""Local children forked by the zygote: each as clean as a fresh interpreter, one zygote per import-time
environment, and nothing of it outliving the parent."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from harness import Parent
from harness.launch import session, zygote
from tests.helpers.processes import alive, wait_gone


def what_a_child_has(ctx, name: str) -> dict:
    import gc
    import tempfile
    import numpy
    import torch
    return {"pid": os.getpid(), "zygote": os.getppid(), "comm": open(f"/proc/{os.getpid()}/comm").read().strip(),
            "variable": os.environ.get(name), "tmp": tempfile.gettempdir(), "cwd": os.getcwd(),
            "numpy": int(numpy.random.randint(1 << 30)), "threads": torch.get_num_threads(),
            "frozen": gc.get_freeze_count(), "collecting": gc.isenabled()}


def test_children_are_forked_warm_and_each_takes_its_own_environment(tmp_path, monkeypatch):
    """Two groups of one environment share a zygote that imported torch once; each child has its own
    variables, temporary directory, working directory, thread count and numpy seed, and names itself."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with Parent() as parent:
        first = parent.fork(2, env={"GROUP": "first", "OMP_NUM_THREADS": "1"}, preload=["torch"])
        first.exec(what_a_child_has, "GROUP")
        a = first.wait()
        second = parent.fork(2, env={"GROUP": "second", "OMP_NUM_THREADS": "1"}, preload=["torch"])
        second.exec(what_a_child_has, "GROUP")
        b = second.wait()
    assert len({child["zygote"] for child in a + b}) == 1 and a[0]["zygote"] != os.getpid()
    assert [child["variable"] for child in a + b] == ["first", "first", "second", "second"]
    assert {child["comm"] for child in a + b} == {"harness.child"}
    assert {(child["tmp"], child["cwd"], child["threads"]) for child in a + b} == {(str(tmp_path), str(tmp_path), 1)}
    assert len({child["numpy"] for child in a + b}) == 4
    # torch's objects, imported by the zygote, are out of the children's collections, which still run
    assert all(child["frozen"] > 100_000 and child["collecting"] for child in a + b)


def test_a_preload_that_fails_is_passed_over_and_what_was_imported_is_frozen_with_collection_back_on():
    """What a fresh child (one whose preloads used CUDA) does with its preloads, and the zygote with its own."""
    probe = ("import gc, sys; from harness.plugins import preload; before = gc.get_freeze_count(); "
             "preload(['no_such_module_here', 'json', 'email.parser']); "
             "print(gc.get_freeze_count() > before, gc.isenabled(), 'email.parser' in sys.modules)")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert shown.stdout.split() == ["True", "True", "True"]


def test_a_variable_read_at_import_gets_a_zygote_of_its_own(monkeypatch):
    with Parent() as parent:
        kids = parent.fork(1)
        kids.exec(lambda ctx: os.getppid())
        [before] = kids.wait()
        monkeypatch.setenv("TORCH_SHOW_CPP_STACKTRACES", "1")       # torch reads it as it loads
        kids = parent.fork(1)
        kids.exec(lambda ctx: (os.getppid(), os.environ["TORCH_SHOW_CPP_STACKTRACES"]))
        [(after, seen)] = kids.wait()
    assert before != after and seen == "1"
    assert zygote.AT_IMPORT and "TORCH_SHOW_CPP_STACKTRACES".startswith(zygote.AT_IMPORT)


def where_the_probe_came_from(ctx) -> tuple:
    import probe_preload
    return os.getppid(), probe_preload.WHERE, sys.path[0]


def test_a_search_path_of_its_own_is_served_warm_unless_it_finds_a_preload_elsewhere(tmp_path, monkeypatch):
    """A folder put first on the path (a test's, a notebook's) gets the warm zygote where it holds none of the
    modules the zygote imported, the child searching the new path; one that holds a preload of its own gets a
    zygote that imports that one, as a fresh interpreter would."""
    first, other, shadow = (tmp_path / name for name in ("first", "other", "shadow"))
    for folder, where in ((first, "first"), (other, None), (shadow, "shadow")):
        folder.mkdir()
        if where:
            (folder / "probe_preload.py").write_text(f"WHERE = {where!r}\n")
    seen = []
    with Parent() as parent:
        for folder in (first, other, shadow):
            monkeypatch.syspath_prepend(str(folder))
            kids = parent.fork(1, preload=["probe_preload"])
            kids.exec(where_the_probe_came_from)
            seen += kids.wait()
    (warm, *_), (again, *_), (fresh, *_) = seen
    assert [s[1:] for s in seen] == [("first", str(first)), ("first", str(other)), ("shadow", str(shadow))]
    assert again == warm and fresh != warm


def test_the_zygote_and_its_children_end_with_a_killed_parent(tmp_path):
    script = textwrap.dedent("""
        import os, sys, time
        from harness import Parent
        parent = Parent()
        kids = parent.fork(2)
        kids.exec(lambda ctx: (os.getpid(), os.getppid()))
        pids = kids.wait()
        print(" ".join(str(p) for pair in pids for p in pair), flush=True)
        time.sleep(600)
    """)
    run = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        child_a, zygote_pid, child_b, _ = map(int, run.stdout.readline().split())
        assert alive(zygote_pid) and zygote_pid != run.pid
        run.send_signal(signal.SIGKILL)
        run.wait()
        assert wait_gone([child_a, child_b, zygote_pid], 5.0) == []
    finally:
        run.kill()


def zygote_of(parent, preload: str) -> int:
    """The pid of the zygote that forks a child preloading ``preload`` (each module: an environment of its own)."""
    kids = parent.fork(1, preload=[preload])
    kids.exec(lambda ctx: os.getppid())
    [pid] = kids.wait()
    kids.stop()             # its child gone: the zygote is idle
    return pid


def test_idle_zygotes_of_other_environments_stay_warm_up_to_kept_and_the_least_recently_used_ends(monkeypatch):
    monkeypatch.setattr(zygote, "KEPT", 2)
    with Parent() as parent:
        first = zygote_of(parent, "json")
        second = zygote_of(parent, "csv")
        assert zygote_of(parent, "json") == first and alive(second)     # json's again: used last now
        third = zygote_of(parent, "wave")           # a third environment: csv's, used least recently, ends
    assert len({first, second, third}) == 3
    assert wait_gone([second], 5.0) == [] and alive(first) and alive(third)


@pytest.mark.parametrize("command", [zygote.START, session.COMMAND], ids=["zygote", "host session"])
def test_a_ctrl_c_while_the_zygote_or_a_host_session_imports_is_ignored_as_it_is_once_warm(command):
    """Ctrl-C reaches the zygote with the whole process group, and Slurm signals a step's every process (a host
    session); one during the first import printed a KeyboardInterrupt traceback and killed it. Their commands
    ignore SIGINT and SIGTERM before they import anything: here the import is replaced by a SIGINT and a SIGTERM
    to itself."""
    before_import = command[:command.index("from harness")]
    assert before_import.strip()
    signalled = before_import + "import os, signal; os.kill(os.getpid(), signal.SIGINT); " \
                                "os.kill(os.getpid(), signal.SIGTERM); print('imported')"
    done = subprocess.run([sys.executable, "-c", signalled], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "imported\n" and not done.stderr, done
