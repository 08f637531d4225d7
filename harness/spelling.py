"""The name a misspelt value most likely meant: the " (did you mean 'epochs'?)" of a one-line refusal.

Imports nothing of the harness or torch: the parent's checks, the dataset registry and the model factories
all use it.
"""
from __future__ import annotations

import difflib
from typing import Iterable

__all__ = ["did_you_mean"]


def did_you_mean(word: str, names: Iterable[str], cutoff: float = 0.6) -> str:
    """``" (did you mean 'name'?)"`` for the closest of ``names`` to ``word``; "" where none is close enough
    (``difflib``'s ratio ``cutoff``). Of the close ones, a name of the same letters comes first: two letters
    swapped is the commonest slip, which the ratio ranks below a dropped letter (``--modle``: ``--model``, not
    ``--mode``)."""
    close = difflib.get_close_matches(word, list(names), n=3, cutoff=cutoff)
    close = [name for name in close if sorted(name) == sorted(word)] or close
    return f" (did you mean {close[0]!r}?)" if close else ""
