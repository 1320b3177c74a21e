"""How ``paimon-group`` fails: one line, ``error: ...``, and an exit code.

Bad input exits 2 (a usage error included), a handler that kept failing 3,
any other error we can explain 1.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from coordinators.errors import ConfigError, PaimonGroupError
from paimon_group.errors import HandlerFailed

F = TypeVar("F", bound=Callable[..., Any])


def friendly_errors(fn: F) -> F:
    """One line and a non-zero exit for every error we know how to explain."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(2)
        except HandlerFailed as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(3)
        except PaimonGroupError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


class OneLineErrors(click.Group):
    """A command group whose usage errors are one line, ``error: ...``, exit 2.

    Click's own format is three lines (usage, hint, error); a bad flag should
    read like every other bad input of this CLI.
    """

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except click.ClickException as err:
            hint = ""
            if isinstance(err, click.UsageError) and err.ctx is not None:
                hint = f" (see {err.ctx.command_path} --help)"
            click.echo(f"error: {err.format_message()}{hint}", err=True)
            sys.exit(err.exit_code)
        except click.Abort:
            click.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list with each summary whole (click cuts them with "...")."""
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=200)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
