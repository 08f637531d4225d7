"""Fixtures shared by the test modules; their helpers live in tests/helpers/. The suite runs on two
pytest-xdist workers by default (``-n 2 --dist loadgroup`` in pyproject.toml: about 0.75 of the time in one
process, which ``-n 0`` gives), with what must not run at once grouped below. Three workers are too many
for a 2-core machine: under load there the shared-memory group and heal tests failed."""
import fcntl
import os

import pytest

from tests.helpers.ci import missing
from tests.helpers.data_files import make_image_folder, make_token_files
from tests.helpers import slow_model
from tests.helpers.netns_hosts import Hosts, why_no_slurm, why_not
from tests.helpers.runs import end_every_run


@pytest.fixture(scope="session")
def images(tmp_path_factory):
    """3 classes of 8 training and 2 validation JPEGs (tests that break files work on a copy)."""
    return make_image_folder(tmp_path_factory.mktemp("images"), classes=3, per_class=8, val_per_class=2)


@pytest.fixture(scope="session")
def tokens(tmp_path_factory):
    """train.bin of 12,000 and val.bin of 2,000 uint16 tokens below 64."""
    return make_token_files(tmp_path_factory.mktemp("tokens"), train_tokens=12_000, val_tokens=2_000, vocab=64)


@pytest.fixture(scope="session")
def slow_straight(tmp_path_factory):
    """The checkpoint of the slow model's uninterrupted run (slow_model.FLAGS), which a healed or
    restarted run of the same flags must equal bit for bit: trained once for all xdist workers."""
    from tests.helpers.training import run_train        # imports Train.py: only for the tests that need it
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "slow_straight"   # this session's
    shared.mkdir(exist_ok=True)
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (shared / "trained").exists():
            run_train(shared, *slow_model.FLAGS, "--save-every-steps", "20", name="straight")
            (shared / "trained").touch()
    return shared / "straight.pt"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests on the namespaced hosts (their sshd, Slurm daemons, torchrun and mpirun) run one after
    another on one xdist worker (--dist loadgroup). First among the hooks: xdist's own, in each worker, turns
    the marker into the group it schedules by, and a marker added after it would group nothing."""
    for item in items:
        if "hosts" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("netns_hosts"))


@pytest.fixture(autouse=True)
def in_a_folder_of_its_own(tmp_path_factory, monkeypatch):
    """Each test runs in an empty folder of its own: what Train.py writes where no flag says otherwise
    (checkpoints/, runs/) lands there, never in the checkout nor where a test on another xdist worker
    writes."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture(autouse=True)
def no_train_py_outlives_its_test():
    """Whatever a test did with the Train.py processes it started (tests/helpers/runs.py), none of
    them, nor their workers, outlives it."""
    yield
    end_every_run()


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """Three hosts as network namespaces with sshd (tests/helpers/netns_hosts.py), for one test module."""
    reason = why_not()
    if reason:
        missing(f"cannot make hosts as network namespaces here: {reason}")
    made = Hosts(tmp_path_factory.mktemp("hosts"))
    yield made
    made.close()


@pytest.fixture(scope="module")
def slurm(hosts) -> dict[str, str]:
    """A real Slurm cluster over the three hosts: the environment salloc, sbatch and srun need."""
    reason = why_no_slurm()
    if reason:
        missing(f"cannot run Slurm here: {reason}")
    return hosts.start_slurm()
