"""MPS support (harness.launch.mps and scripts/*mps*.sh) against fake nvidia-cuda-mps-control and nvidia-smi."""
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from harness.launch import mps

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"

# -d: "starts" a daemon (the control file) unless FAKE_MPS_NEVER_UP; a command on stdin: quit
# removes the control file, get_server_list succeeds while it exists. Every call is logged.
FAKE_CONTROL = r"""#!/usr/bin/env bash
pipe=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}
logdir=${CUDA_MPS_LOG_DIRECTORY:-/tmp/nvidia-log}
if [[ ${1:-} == -d ]]; then
    echo "-d $pipe" >> "$FAKE_RECORD/calls.log"
    env > "$FAKE_RECORD/daemon-env.txt"
    [[ -e $pipe/control ]] && { echo "An instance of this daemon is already running" >&2; exit 1; }
    echo "[fake] Starting control daemon using socket $pipe/control" >> "$logdir/control.log"
    if [[ -n ${FAKE_MPS_NEVER_UP:-} ]]; then echo "[fake] cannot find a GPU" >> "$logdir/control.log"; exit 0; fi
    : > "$pipe/control"
    exit 0
fi
read -r command
echo "$command $pipe" >> "$FAKE_RECORD/calls.log"
case $command in
    quit) [[ -e $pipe/control ]] || exit 1; rm "$pipe/control" ;;
    get_server_list) [[ -e $pipe/control ]] ;;
    *) exit 1 ;;
esac
"""

FAKE_SMI = r"""#!/usr/bin/env bash
echo "$*" >> "$FAKE_RECORD/smi.log"
case " $* " in
    *" --query-gpu=index "*) printf '0\n1\n' ;;
esac
"""


@pytest.fixture
def mps_root():
    """$MPS_ROOT for the scripts, with a space to check the quoting; short, as socket paths under it must
    be (an xdist worker's tmp_path is not)."""
    with tempfile.TemporaryDirectory(prefix="mps-") as short:
        yield Path(short) / "mps root"


@pytest.fixture
def fake(tmp_path, mps_root, monkeypatch):
    """Fake binaries first on PATH; returns the directory where they record their calls."""
    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    record.mkdir()
    for name, text in (("nvidia-cuda-mps-control", FAKE_CONTROL), ("nvidia-smi", FAKE_SMI)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_RECORD", str(record))
    monkeypatch.setenv("MPS_ROOT", str(mps_root))
    for name in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    return record


def calls(record: Path, name: str = "calls.log") -> list[str]:
    path = record / name
    return path.read_text().splitlines() if path.exists() else []


# --- harness.launch.mps -------------------------------------------------------------------------------

def test_start_and_stop(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("INHERITED_MARKER", "yes")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    daemon = mps.start_mps(tmp_path / "run")
    pipe, logs = tmp_path / "run" / "mps-pipe", tmp_path / "run" / "mps-log"
    assert (daemon.pipe_dir, daemon.log_dir) == (pipe, logs)
    assert daemon.env == {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    assert (pipe / "control").exists() and daemon.answers()
    started = dict(line.split("=", 1) for line in calls(fake, "daemon-env.txt") if "=" in line)
    assert started["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert started["CUDA_MPS_LOG_DIRECTORY"] == str(logs)
    assert started["INHERITED_MARKER"] == "yes"
    assert "CUDA_VISIBLE_DEVICES" not in started     # serves every GPU: children name machine-wide ids
    daemon.stop()
    assert not (pipe / "control").exists() and not daemon.answers()
    assert f"quit {pipe}" in calls(fake)


def test_stop_is_idempotent(fake, tmp_path):
    daemon = mps.start_mps(tmp_path)
    daemon.stop()
    before = calls(fake)
    daemon.stop()
    assert calls(fake) == before                   # the second stop does not even ask
    other = mps.start_mps(tmp_path / "other")
    (other.pipe_dir / "control").unlink()          # the daemon died on its own
    other.stop()
    other.stop()


def test_context_manager_stops_on_exception(fake, tmp_path):
    with pytest.raises(KeyError):
        with mps.start_mps(tmp_path) as daemon:
            assert (daemon.pipe_dir / "control").exists()
            raise KeyError("boom")
    assert not (daemon.pipe_dir / "control").exists()
    assert f"quit {daemon.pipe_dir}" in calls(fake)


def test_refuses_a_daemon_already_running(fake, tmp_path):
    with mps.start_mps(tmp_path):
        with pytest.raises(RuntimeError, match="already answers on"):
            mps.start_mps(tmp_path)


def test_missing_binary(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(RuntimeError, match="nvidia-cuda-mps-control was not found on PATH.*without --mps"):
        mps.start_mps(tmp_path / "run")


def test_daemon_that_never_comes_up(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_NEVER_UP", "1")
    with pytest.raises(RuntimeError) as caught:
        mps.start_mps(tmp_path, timeout=0.3)
    message = str(caught.value)
    assert "did not come up within 0.3 s" in message
    assert "[fake] cannot find a GPU" in message and "control.log" in message


def test_too_long_path(fake, tmp_path):
    directory = tmp_path / ("x" * 100)
    with pytest.raises(ValueError, match="too long for MPS.*shorter --log-dir"):
        mps.start_mps(directory)
    assert not directory.exists() and calls(fake) == []


def test_active_mps_env():
    assert mps.active_mps_env({"PATH": "/bin"}) is None
    assert mps.active_mps_env({"CUDA_MPS_PIPE_DIRECTORY": ""}) is None
    assert mps.active_mps_env({"CUDA_MPS_PIPE_DIRECTORY": "/p"}) == {"CUDA_MPS_PIPE_DIRECTORY": "/p"}
    both = {"CUDA_MPS_PIPE_DIRECTORY": "/p", "CUDA_MPS_LOG_DIRECTORY": "/l", "X": "1"}
    assert mps.active_mps_env(both) == {"CUDA_MPS_PIPE_DIRECTORY": "/p", "CUDA_MPS_LOG_DIRECTORY": "/l"}


# --- scripts/*mps*.sh --------------------------------------------------------------------------

def script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPTS / name), *args], capture_output=True, text=True, timeout=30)


def test_scripts_are_executable():
    for name in ("init_mps_for_gpus.sh", "stop_mps_for_gpus.sh", "set_mps_env_for_gpus.sh",
                 "init_mps_for_all_gpus.sh", "stop_mps_for_all_gpus.sh", "set_mps_env_for_all_gpus.sh"):
        assert os.access(SCRIPTS / name, os.X_OK), name


def test_init_and_stop_a_group(fake, mps_root):
    root = mps_root
    pipe, logs = root / "nvidia-mps_0,1", root / "nvidia-log_0,1"
    done = script("init_mps_for_gpus.sh", "0,1")
    assert done.returncode == 0, done.stderr
    assert (pipe / "control").exists() and logs.is_dir()
    started = dict(line.split("=", 1) for line in calls(fake, "daemon-env.txt") if "=" in line)
    assert (started["CUDA_VISIBLE_DEVICES"], started["CUDA_MPS_PIPE_DIRECTORY"]) == ("0,1", str(pipe))
    assert started["CUDA_MPS_LOG_DIRECTORY"] == str(logs)

    again = script("init_mps_for_gpus.sh", "0,1")
    assert again.returncode == 1 and "already answers" in again.stderr and "stop_mps_for_gpus.sh 0,1" in again.stderr

    stopped = script("stop_mps_for_gpus.sh", "0,1")
    assert stopped.returncode == 0, stopped.stderr
    assert not (pipe / "control").exists() and "stopped" in stopped.stdout
    assert f"quit {pipe}" in calls(fake)
    idle = script("stop_mps_for_gpus.sh", "0,1")
    assert idle.returncode == 0 and "no MPS control daemon was running" in idle.stdout
    assert not any("-c" in line.split() for line in calls(fake, "smi.log"))    # compute mode untouched


def test_exclusive_sets_and_resets_compute_mode(fake):
    assert script("init_mps_for_gpus.sh", "--exclusive", "0,1").returncode == 0
    assert calls(fake, "smi.log") == ["-i 0 -c EXCLUSIVE_PROCESS", "-i 1 -c EXCLUSIVE_PROCESS"]
    assert script("stop_mps_for_gpus.sh", "0,1", "--exclusive").returncode == 0
    assert calls(fake, "smi.log")[2:] == ["-i 0 -c DEFAULT", "-i 1 -c DEFAULT"]


@pytest.mark.parametrize("bad", ["0;rm", "0,,1", "a", "0, 1", "-1", ""])
def test_bad_gpu_list_is_refused(fake, mps_root, bad):
    for name in ("init_mps_for_gpus.sh", "stop_mps_for_gpus.sh", "set_mps_env_for_gpus.sh"):
        done = script(name, bad)
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        assert "usage:" in done.stderr and (f"'{bad}'" in done.stderr or "no GPU list" in done.stderr)
        assert done.stdout == ""
    assert calls(fake) == [] and not mps_root.exists()


def test_usage_and_bad_options(fake):
    helped = script("init_mps_for_gpus.sh", "--help")
    assert helped.returncode == 0 and "EXCLUSIVE_PROCESS" in helped.stdout and "shared machine" in helped.stdout
    assert script("set_mps_env_for_gpus.sh", "-h").stdout == ""      # usage on stderr, never eval'd
    assert "usage:" in script("set_mps_env_for_gpus.sh", "-h").stderr
    for args in (("0", "--force"), ("0", "1"), ("0", "--exclusive")):
        name = "set_mps_env_for_gpus.sh" if args[1] == "--exclusive" else "init_mps_for_gpus.sh"
        done = script(name, *args)
        assert done.returncode == 2 and f"'{args[1]}'" in done.stderr
    assert script("init_mps_for_all_gpus.sh", "0,1").returncode == 2
    assert calls(fake) == []


def test_set_env_eval_and_source(fake, mps_root):
    root = mps_root
    show = 'echo "$CUDA_MPS_PIPE_DIRECTORY|$CUDA_MPS_LOG_DIRECTORY|$CUDA_VISIBLE_DEVICES|$-"'
    env_script = SCRIPTS / "set_mps_env_for_gpus.sh"
    evaled = subprocess.run(["bash", "-c", f'eval "$("{env_script}" 0,1)" && {show}'],
                            capture_output=True, text=True, timeout=30)
    assert evaled.returncode == 0, evaled.stderr
    pipe, logs, visible, _ = evaled.stdout.strip().split("|")
    assert (pipe, logs, visible) == (f"{root}/nvidia-mps_0,1", f"{root}/nvidia-log_0,1", "0,1")
    assert "no MPS daemon answers" in evaled.stderr                 # not started yet: warned
    # Sourced, for the group 2,3: the MPS server numbers its GPUs from 0, and the caller's shell
    # options are left alone (no errexit); a bad list fails the source without ending the shell.
    assert script("init_mps_for_gpus.sh", "2,3").returncode == 0
    sourced = subprocess.run(["bash", "-c", f'source "{env_script}" 2,3 && {show}; source "{env_script}" "0;rm";'
                              ' echo "status $?"'], capture_output=True, text=True, timeout=30)
    pipe, logs, visible, flags = sourced.stdout.splitlines()[0].split("|")
    assert (pipe, logs, visible) == (f"{root}/nvidia-mps_2,3", f"{root}/nvidia-log_2,3", "0,1")
    assert "e" not in flags and "u" not in flags
    assert sourced.stdout.splitlines()[1] == "status 1" and "no MPS daemon answers" not in sourced.stderr


def test_all_gpu_scripts_use_the_list_from_nvidia_smi(fake, mps_root):
    pipe = mps_root / "nvidia-mps_0,1"
    assert script("init_mps_for_all_gpus.sh").returncode == 0
    assert (pipe / "control").exists()
    assert calls(fake, "smi.log") == ["--query-gpu=index --format=csv,noheader"]
    evaled = subprocess.run(["bash", "-c", f'eval "$("{SCRIPTS}/set_mps_env_for_all_gpus.sh")" &&'
                             ' echo "$CUDA_MPS_PIPE_DIRECTORY"'], capture_output=True, text=True, timeout=30)
    assert evaled.stdout.strip() == str(pipe)
    assert script("stop_mps_for_all_gpus.sh").returncode == 0
    assert not (pipe / "control").exists()
    assert script("init_mps_for_all_gpus.sh", "--exclusive").returncode == 0
    assert script("stop_mps_for_all_gpus.sh", "--exclusive").returncode == 0
    assert [line for line in calls(fake, "smi.log") if "-c" in line.split()] == [
        "-i 0 -c EXCLUSIVE_PROCESS", "-i 1 -c EXCLUSIVE_PROCESS", "-i 0 -c DEFAULT", "-i 1 -c DEFAULT"]


def test_shell_syntax():
    for path in sorted(SCRIPTS.glob("*mps*.sh")):
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0, path

