"""Prerequisites a test cannot do without (network namespaces, sshd, Slurm): where they are missing
a developer's machine skips the test, but CI (``CI=true``, as .ci/run and most CI services set it)
installs them, so there a missing one is a failure, never a silent skip."""
from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing(reason: str) -> None:
    """Skip the running test for ``reason``; in CI, fail it."""
    if in_ci():
        pytest.fail(f"CI must be able to run this test: {reason}", pytrace=False)
    pytest.skip(reason)
