"""README.md shows flag defaults in brackets (`--lr` [0.05]); they must stay the code's.

A default in README is either a literal (the text before its first ",", ";" or ":" is one word:
[0.05], [0: never], [checkpoints/model.pt; '' to not save]) that must equal the code's default
after conversion to its type, or a description of what the code derives at run time ([all GPUs,
else CPU]), for which the code's default must be None and ``--help`` must say what it means.
Changing a default in the code or in README alone fails here.
"""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import Test
from harness.training.config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
# `--flag ...` (optionally `/`--no-flag``) directly followed by [default]
SHOWN = re.compile(r"`(--[a-z0-9-]+)[^`]*`(?:/`--no-[a-z0-9-]+`)?\s*\[([^\]]*)\]")
BOOLEANS = {"on": True, "off": False}


def section(title: str) -> str:
    """README.md's section under ``## title``, up to the next ``## ``."""
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def shown_defaults(text: str) -> dict[str, str]:
    """{field name: the bracketed default} for every flag shown with one."""
    return {flag[2:].replace("-", "_"): default.strip() for flag, default in SHOWN.findall(text)}


def literal(shown: str) -> str | None:
    """The literal a shown default states, or None when it describes a derived default."""
    head = re.split(r"[,;:]", shown, maxsplit=1)[0].strip()
    return head if len(head.split()) == 1 else None


def as_type(text: str, code_default: Any) -> Any:
    """README's literal as the type of the code's default (None: no literal can equal it)."""
    if isinstance(code_default, bool):
        return BOOLEANS.get(text, text)
    if isinstance(code_default, (int, float)):
        try:
            return type(code_default)(text)
        except ValueError:
            return text
    return text


def help_entries() -> dict[str, str]:
    """``python Train.py --help``: {flag: its help text on one line}, each --flag/--no-flag its own key."""
    out = subprocess.run([sys.executable, "Train.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    entries: dict[str, str] = {}
    for block in re.split(r"\n(?=  -)", out)[1:]:          # [0] is the usage and the description
        names = block.splitlines()[0].strip().split("  ")[0]  # "--tf32, --no-tf32", "--lr LR"
        for flag in re.findall(r"--[a-z0-9-]+", names):
            entries[flag] = " ".join(block.split())
    return entries


def check(shown: dict[str, str], defaults: dict[str, Any]) -> list[str]:
    """Every disagreement between README's shown defaults and the code's, as a line."""
    wrong = []
    for name, text in shown.items():
        flag = "--" + name.replace("_", "-")
        if name not in defaults:
            wrong.append(f"{flag}: README shows a default [{text}] but the code has no such option")
            continue
        value, code = literal(text), defaults[name]
        if value is None and code is not None:
            wrong.append(f"{flag}: README describes [{text}] but the code's default is {code!r}, not derived")
        elif value is not None and as_type(value, code) != code:
            wrong.append(f"{flag}: README shows [{text}] but the code's default is {code!r}")
    return wrong


def test_train_flag_defaults_in_readme_are_the_codes():
    shown = shown_defaults(section("Train.py: the main flags"))
    assert shown, "no `--flag` [default] found in README's Train.py section"
    defaults = {f.name: getattr(TrainConfig(), f.name) for f in dataclasses.fields(TrainConfig)}
    assert check(shown, defaults) == []


def test_derived_train_defaults_are_explained_by_help():
    shown = shown_defaults(section("Train.py: the main flags"))
    entries = help_entries()
    derived = [name for name, text in shown.items() if literal(text) is None]
    assert derived, "README shows no derived default: the parse of its brackets changed"
    unexplained = [name for name in derived if "default" not in entries.get("--" + name.replace("_", "-"), "")]
    assert unexplained == [], f"Train.py --help does not say what these defaults mean: {unexplained}"


def test_every_flag_readme_names_is_a_train_py_flag():
    named = set(re.findall(r"`(--[a-z0-9-]+)", section("Train.py: the main flags")))
    assert named - set(help_entries()) == set()


def test_test_py_flag_defaults_in_readme_are_the_codes():
    shown = shown_defaults(section("Test.py"))
    assert shown, "no `--flag` [default] found in README's Test.py section"
    assert check(shown, vars(Test.parse_args([]))) == []


def test_check_catches_a_default_changed_on_one_side():
    """The comparison itself: a literal that differs, a description over a literal default, a type."""
    assert check({"lr": "0.01"}, {"lr": 0.05}) == ["--lr: README shows [0.01] but the code's default is 0.05"]
    assert check({"gpus": "all GPUs, else CPU"}, {"gpus": "all"}) != []
    assert check({"epochs": "10"}, {"epochs": None}) != []
    assert check({"tf32": "on"}, {"tf32": False}) != []
    assert check({"batch_size": "32, per worker"}, {"batch_size": 32}) == []


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_relative_links_in_readme_and_docs_resolve():
    """Every relative link of README.md and docs/*.md names a file of the checkout (and, into a
    markdown file, one of its headings)."""
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and file.suffix == ".md" and anchor not in {
                    slug(h) for h in re.findall(r"^#+ (.+)$", file.read_text(), flags=re.M)}:
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == [], broken
