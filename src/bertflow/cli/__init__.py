"""The ``bertflow`` command. Each subcommand group lives in its own module and registers on :data:`app`
(``cli/_app.py``); importing this package imports them all."""

from __future__ import annotations

import logging
import os
import sys

# Importing the modules registers their commands, in the order `bertflow --help` lists them: the everyday ones first.
from . import fit, encode, similarity  # noqa: F401  # isort: skip
from . import distributed_encode, distributed_fit, evaluate, search  # noqa: F401  # isort: skip
from ._app import EXIT_BROKEN_PIPE, EXIT_RUNTIME, EXIT_USAGE, app, end_on_broken_pipe

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_RUNTIME", "EXIT_USAGE", "app", "main"]


def main() -> None:
    """Console entry point (``bertflow``); ``BERTFLOW_LOG=INFO`` shows library logs."""
    logging.basicConfig(
        level=os.environ.get("BERTFLOW_LOG", "WARNING").upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        app()
    finally:
        # Output still buffered when the command returned meets a closed pipe here, not at interpreter exit.
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            end_on_broken_pipe()
            sys.exit(EXIT_BROKEN_PIPE)
