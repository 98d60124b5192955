"""Exceptions raised by bertflow.

Every error a user can trigger with bad input is one of these, with a message that names the problem and,
where there is one, the fix. They subclass the built-in exception a caller would expect (``ValueError`` for
bad values, ``OSError`` for bad files) so generic handlers keep working.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "BertflowError",
    "InputError",
    "InputTypeError",
    "NotFittedError",
    "ModelFileError",
    "OutputError",
    "CompatibilityError",
    "DivergenceError",
    "DataNotFoundError",
    "describe_os_error",
]


class BertflowError(Exception):
    """Base class of every bertflow error."""


class InputError(BertflowError, ValueError):
    """Bad user input: empty or non-text sentences, undecodable files, malformed TSV, NaN embeddings."""


class InputTypeError(InputError, TypeError):
    """Input of the wrong type: an array whose items are not numbers. A ``TypeError`` too, as numpy and
    scikit-learn raise for it."""


class ModelFileError(BertflowError, OSError):
    """A saved model folder is missing, truncated, corrupted or edited."""


class OutputError(BertflowError, OSError):
    """An output that may not or cannot be written: it would replace the input, the working directory or a
    folder of another kind, it exists without ``overwrite``, or its place is read-only or missing."""


class CompatibilityError(BertflowError, ValueError):
    """A calibrator or index does not match the encoder or dimension it is used with. (A file written in a newer
    format is a :class:`ModelFileError`: this bertflow cannot read it.)"""


class DivergenceError(BertflowError, RuntimeError):
    """Flow fitting produced a non-finite loss; the message names the step. :attr:`result`: what the trainer kept
    (a :class:`~bertflow.calibrators.flow_trainer.FlowFit`: the parameters of the last clean check and the history),
    or ``None``."""

    result: Any = None


class DataNotFoundError(BertflowError, FileNotFoundError):
    """Evaluation data is not where it was looked for (and could not be downloaded)."""


def describe_os_error(e: OSError) -> str:
    """One line for an operating-system error: the file and the system's reason (``disk full`` spelled out)."""
    import errno

    if isinstance(e, BertflowError):
        return str(e)
    reason = "no space left on the device (disk full)" if e.errno == errno.ENOSPC else (e.strerror or str(e))
    return f"{e.filename}: {reason}" if e.filename else reason


if TYPE_CHECKING:  # what static tools see; at run time it is made by __getattr__ below
    from sklearn.exceptions import NotFittedError as _SklearnNotFittedError

    class NotFittedError(BertflowError, _SklearnNotFittedError): ...


def __getattr__(name: str) -> Any:
    # NotFittedError subclasses scikit-learn's, and importing scikit-learn takes about a second: it is created on
    # first use, so the CLI's help and error paths (which import this module) stay fast.
    if name != "NotFittedError":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from sklearn.exceptions import NotFittedError as SklearnNotFittedError

    class NotFittedError(BertflowError, SklearnNotFittedError):
        """A calibrator was used before ``fit``: scikit-learn's ``NotFittedError`` (so a ``ValueError`` and an
        ``AttributeError``), which ``except sklearn.exceptions.NotFittedError`` catches too."""

    NotFittedError.__module__, NotFittedError.__qualname__ = __name__, "NotFittedError"  # picklable by name
    globals()[name] = NotFittedError
    return NotFittedError
