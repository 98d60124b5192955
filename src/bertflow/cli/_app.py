"""The ``bertflow`` Typer application (:data:`app`), its error handling and exit statuses; the command modules
register on it, and ``bertflow.cli`` (the package) imports them all."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
from typer.core import TyperGroup

#: Exit statuses (README, "Command line"). 0: done.
#: A usage error: the command asked for something wrong (an unknown option or value, a missing or malformed input
#: file, a model folder that does not load, an output path that may not be written); fix the command and rerun.
EXIT_USAGE = 2
#: A runtime error: the command was fine but the run failed (disk full, an I/O or permission error from the
#: system, a flow that diverged); the same command may succeed on another machine or another try.
EXIT_RUNTIME = 1
#: The reader of standard output went away (``bertflow ... | head``): the command ends quietly, with 128 + SIGPIPE
#: as a Unix tool killed by that signal.
EXIT_BROKEN_PIPE = 141


#: click's UsageError, the base of every refusal while parsing (recent typer ships its own copy of click).
_UsageError = typer.BadParameter.__base__


def end_on_broken_pipe() -> None:
    """Point standard output at /dev/null, so the interpreter's last flush cannot fail again with a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


class _Group(TyperGroup):
    """Turns click's usage errors and bertflow's own errors into one clear line on stderr and exit status
    :data:`EXIT_USAGE` or :data:`EXIT_RUNTIME`, never a traceback; a closed standard output ends quietly
    (:data:`EXIT_BROKEN_PIPE`)."""

    def invoke(self, ctx: typer.Context):  # noqa: ANN201
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            end_on_broken_pipe()
            ctx.exit(EXIT_BROKEN_PIPE)
        except _UsageError as e:  # an option click refused (unknown, out of range, not a choice)
            where = f" (see {e.ctx.command_path} --help)" if e.ctx else ""
            typer.echo(f"bertflow: error: {e.format_message()}{where}", err=True)
            ctx.exit(EXIT_USAGE)
        except Exception as e:  # OSError included
            # Imported here, on the error path only: bertflow.errors loads scikit-learn (NotFittedError's base),
            # which `bertflow --help` should not pay for.
            from ..errors import BertflowError, DivergenceError, describe_os_error

            if isinstance(e, BertflowError):
                text, status = str(e), EXIT_RUNTIME if isinstance(e, DivergenceError) else EXIT_USAGE
            elif isinstance(e, OSError):  # disk full, a folder turned read-only mid-run...: what the system said
                text, status = describe_os_error(e), EXIT_RUNTIME
            else:
                raise
            typer.echo(f"bertflow: error: {text}", err=True)
            ctx.exit(status)


app = typer.Typer(
    cls=_Group,
    name="bertflow",
    help="Label-free calibration of transformer sentence embeddings (BERT-flow, whitening and friends).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from .._version import __version__

        typer.echo(f"bertflow {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", metavar="", callback=_print_version, is_eager=True, help="Print bertflow's version and exit."
        ),
    ] = False,
) -> None:
    pass
