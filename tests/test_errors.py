"""The exception classes: each is the built-in a generic handler expects, one line describes an OSError, and
NotFittedError is scikit-learn's, made on first use and picklable by name."""

from __future__ import annotations

import errno
import pickle

import pytest

from bertflow import errors
from bertflow.errors import (
    BertflowError,
    CompatibilityError,
    DataNotFoundError,
    DivergenceError,
    InputError,
    InputTypeError,
    ModelFileError,
    OutputError,
    describe_os_error,
)


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (InputError, ValueError),
        (InputTypeError, TypeError),
        (InputTypeError, ValueError),
        (ModelFileError, OSError),
        (OutputError, OSError),
        (CompatibilityError, ValueError),
        (DivergenceError, RuntimeError),
        (DataNotFoundError, FileNotFoundError),
    ],
)
def test_each_error_is_the_builtin_a_caller_expects(cls, builtin):
    assert issubclass(cls, BertflowError) and issubclass(cls, builtin)
    with pytest.raises(builtin, match="the message"):
        raise cls("the message")


def test_describe_os_error_is_one_line_with_the_file_and_the_reason():
    full = OSError(errno.ENOSPC, "No space left on device", "/data/out.npy")
    assert describe_os_error(full) == "/data/out.npy: no space left on the device (disk full)"
    denied = PermissionError(errno.EACCES, "Permission denied", "/root/x")
    assert describe_os_error(denied) == "/root/x: Permission denied"
    assert describe_os_error(OSError("plain")) == "plain"
    ours = ModelFileError("model folder m: config.json is missing")
    assert describe_os_error(ours) == str(ours)  # a bertflow error keeps its own message


def test_not_fitted_error_is_scikit_learns_and_picklable():
    from sklearn.exceptions import NotFittedError as SklearnNotFittedError

    cls = errors.NotFittedError
    assert cls is errors.NotFittedError  # made once
    assert issubclass(cls, BertflowError) and issubclass(cls, SklearnNotFittedError)
    assert issubclass(cls, ValueError) and issubclass(cls, AttributeError)
    again = pickle.loads(pickle.dumps(cls("not fitted")))
    assert type(again) is cls and str(again) == "not fitted"
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = errors.Nope
