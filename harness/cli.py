"""argparse for the harness's commands (Train.py, Test.py): a mistyped flag is one line, as every other bad input
is, naming the closest flag or choice, rather than argparse's usage block (36 lines for Train.py) over its error.
"""
from __future__ import annotations

import argparse
import re
from typing import NoReturn

from harness.spelling import did_you_mean

__all__ = ["OneLineParser"]

_UNKNOWN = re.compile(r"unrecognized arguments: (.*)")
_CHOICE = re.compile(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)")


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are ``PROG: error: MESSAGE (did you mean ...?); see PROG --help``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}{self._guess(message)}; see {self.prog} --help\n")

    def _guess(self, message: str) -> str:
        """The closest flag to the first unknown one, or the closest choice to a value off a flag's list."""
        unknown = _UNKNOWN.match(message)
        if unknown:
            flags = [option for action in self._actions for option in action.option_strings]
            words = [word.split("=", 1)[0] for word in unknown.group(1).split() if word.startswith("-")]
            return did_you_mean(words[0], flags) if words else ""
        choice = _CHOICE.match(message)
        if choice:
            offered = [name.strip().strip("'") for name in choice.group(3).split(",")]
            return did_you_mean(choice.group(2).lower(), offered)
        return ""

