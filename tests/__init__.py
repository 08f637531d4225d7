"""The harness's tests (pytest). A package, so that pytest puts the checkout on ``sys.path`` and the
tests import their shared helpers as ``tests.helpers.*``; no test module imports another."""
