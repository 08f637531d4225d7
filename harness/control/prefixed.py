"""A child's own stdout, each line begun with its rank: ``[3] loss 2.31``.

Why: the children of a group write to the parent's terminal (or the job's log), all of them at once, and a
``print`` in a model's code came out once a child with nothing to say whose it was. ``ctx.print``'s lines,
which the parent prints, carry the same prefix, and so does the child's stderr, which the parent reads and
writes out line by line (harness/control/spawn.py). Only what Python writes is prefixed: output written to the
file descriptor directly (a C library's) is not.
"""
from __future__ import annotations

import io
import sys
from typing import Callable, TextIO

__all__ = ["RankPrefixed", "prefix_output"]


class RankPrefixed(io.TextIOBase):
    """``stream`` with ``prefix()`` written at the start of every line. ``prefix`` is asked at each line: a spare
    child takes the rank of the one it replaces after it started."""

    def __init__(self, stream: TextIO, prefix: Callable[[], str]):
        super().__init__()
        self.stream, self.prefix, self.at_start = stream, prefix, True

    def write(self, text: str) -> int:
        pieces = []
        for line in text.splitlines(keepends=True):
            pieces.append(self.prefix() + line if self.at_start else line)
            self.at_start = line.endswith(("\n", "\r"))
        self.stream.write("".join(pieces))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:
        return self.stream.encoding


def prefix_output(rank: Callable[[], int]) -> None:
    """This process's sys.stdout, prefixed with ``[rank()]``."""
    sys.stdout = RankPrefixed(sys.stdout, lambda: f"[{rank()}] ")
