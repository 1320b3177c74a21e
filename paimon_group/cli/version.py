"""``paimon-group --version``: the release, or a development build and its commit.

A release prints ``paimon-group, version 0.1.0``. Main between releases is
``X.Y.Z.devN`` (docs/releasing.md) and says it is a development build, with
the commit when it runs from a git checkout::

    paimon-group, version 0.2.0.dev0 (development build, commit e847cbf2a1b4)
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import click

from paimon_group.version import __version__

CHECKOUT = Path(__file__).resolve().parents[2]


def checkout_commit(root: Path = CHECKOUT) -> str | None:
    """The commit checked out at ``root`` (12 hex digits, ``+`` when the tree
    has changes), or None outside a git checkout."""
    if not (root / ".git").exists():  # a directory, or a file in a worktree
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD", "--"],
                               capture_output=True, timeout=10).returncode == 1
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+" if dirty else "")


def version_text(version: str = __version__, root: Path = CHECKOUT) -> str:
    """The version as ``--version`` prints it."""
    if ".dev" not in version:
        return version
    commit = checkout_commit(root)
    return f"{version} (development build{f', commit {commit}' if commit else ''})"


def _show(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"paimon-group, version {version_text()}")
    ctx.exit()


def version_option(f: Any) -> Any:
    """The ``--version`` flag of the command group."""
    return click.option("--version", is_flag=True, expose_value=False, is_eager=True,
                        callback=_show, help="Show the version and exit.")(f)
