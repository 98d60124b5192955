"""The ``bertflow`` command. Each subcommand group lives in its own module and registers on :data:`app`."""

from __future__ import annotations

import logging
import os
from typing import Annotated

import click
import typer
from typer.core import TyperGroup

__all__ = ["app", "main"]


class _Group(TyperGroup):
    """Turns bertflow's own errors into one clear line on stderr and exit status 2, never a traceback."""

    def invoke(self, ctx: click.Context):  # noqa: ANN201
        try:
            return super().invoke(ctx)
        except Exception as e:  # OSError included
            # Imported here, on the error path only: bertflow.errors loads scikit-learn (NotFittedError's base),
            # which `bertflow --help` should not pay for.
            from ..errors import BertflowError, describe_os_error

            if isinstance(e, BertflowError):
                click.echo(f"bertflow: error: {e}", err=True)
            elif isinstance(e, OSError):
                # Disk full, a folder turned read-only mid-run...: what the system said, about which file, one line.
                click.echo(f"bertflow: error: {describe_os_error(e)}", err=True)
            else:
                raise
            ctx.exit(2)


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
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print bertflow's version and exit."),
    ] = False,
) -> None:
    pass


# Importing the modules registers their commands on `app`.
from . import core, distributed, evaluate, search  # noqa: E402,F401


def main() -> None:
    """Console entry point (``bertflow``); ``BERTFLOW_LOG=INFO`` shows library logs."""
    logging.basicConfig(
        level=os.environ.get("BERTFLOW_LOG", "WARNING").upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    app()
