"""The docs and ``--help`` agree: every option the README and docs/operations.md
show for a ``paimon-group`` command exists in that command's ``--help``, and
every option has a help text, and no command summary is cut with "..."."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from paimon_group.cli import main

REPO = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/operations.md"]


def commands() -> dict[str, click.Command]:
    out: dict[str, click.Command] = {}

    def walk(cmd: click.Command, path: str) -> None:
        out[path] = cmd
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, f"{path} {name}".strip())

    walk(main, "")
    return out


def options_of(cmd: click.Command) -> set[str]:
    return {o for p in cmd.params if isinstance(p, click.Option) for o in p.opts}


def doc_commands() -> list[tuple[str, str, str]]:
    """(doc, command, option) for each option on a ``paimon-group CMD ...`` line."""
    known = sorted((c for c in commands() if c), key=len, reverse=True)
    found = []
    for doc in DOCS:
        text = (REPO / doc).read_text().replace("\\\n", " ")
        for line in text.splitlines():
            for match in re.finditer(r"paimon-group ([a-z ]+?)(?= --|$| [A-Z])(.*)", line):
                words = match.group(1).strip()
                cmd = next((c for c in known if words.startswith(c)), None)
                if cmd is None:
                    continue
                for opt in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", match.group(2)):
                    found.append((doc, cmd, opt))
    return found


def test_the_docs_show_options_that_exist() -> None:
    cmds = commands()
    found = doc_commands()
    assert len(found) > 20
    wrong = [(doc, cmd, opt) for doc, cmd, opt in found
             if opt not in options_of(cmds[cmd]) | {"--help"}]
    assert not wrong, wrong


@pytest.mark.parametrize("name", sorted(c for c in commands() if c))
def test_every_option_has_help(name: str) -> None:
    cmd = commands()[name]
    missing = [p.opts for p in cmd.params if isinstance(p, click.Option) and not p.help]
    assert not missing, missing
    result = CliRunner().invoke(main, [*name.split(), "--help"], terminal_width=80)
    assert result.exit_code == 0


@pytest.mark.parametrize("group", [[], ["members"]])
def test_command_summaries_are_whole(group: list[str]) -> None:
    result = CliRunner().invoke(main, [*group, "--help"], terminal_width=80)
    listing = result.output.split("Commands:")[1]
    assert "..." not in listing, result.output
