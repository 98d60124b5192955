"""How the distributed commands run a body per rank (``bertflow.cli.ranks``): the rank's device, and a rank's
errors as one line with exit status 2. (The ``--devices`` check: tests/cli/test_options.py; whole jobs, spawned ranks
included: test_distributed_encode.py, test_distributed_fit.py and tests/scale/test_multiprocess.py.)"""

from __future__ import annotations

import errno

import pytest
import torch

from bertflow.cli.ranks import guarded, rank_device, run_on_ranks
from bertflow.errors import InputError


@pytest.fixture()
def one_rank(monkeypatch):
    """A process that is rank 0 of 1, whatever the environment the tests run in."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)


def test_rank_device_reads_cuda_as_this_ranks_gpu(one_rank, monkeypatch):
    assert rank_device("cpu") == "cpu"
    assert rank_device("cuda:1") == "cuda:1"
    assert rank_device(None) == ("cuda:0" if torch.cuda.is_available() else "cpu")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert rank_device("cuda") == "cuda:3"


def test_guarded_runs_the_body_on_the_ranks_device(one_rank):
    seen = []
    guarded(lambda device, args: seen.append((device, args["x"])), None, {"device": "cpu", "x": 1})
    guarded(lambda device, args: seen.append((device, args["x"])), "cpu", {"device": "cuda:7", "x": 2})
    assert seen == [("cpu", 1), ("cpu", 2)]  # a --devices entry wins over --device


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (InputError("the store holds calibrated embeddings"), "bertflow: error: the store holds calibrated embeddings"),
        (OSError(errno.ENOSPC, "No space left on device"), "bertflow: error: no space left on the device (disk full)"),
    ],
    ids=["bertflow-error", "os-error"],
)
def test_guarded_turns_a_ranks_error_into_one_line_and_status_2(one_rank, capsys, error, line):
    def body(device, args):
        raise error

    with pytest.raises(SystemExit) as exit_:
        guarded(body, "cpu", {"device": None})
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(line), err


def test_guarded_prints_nothing_for_an_error_rank_0_already_printed(one_rank, capsys):
    error = InputError("said once, by rank 0")
    error.from_rank0 = True

    def body(device, args):
        raise error

    with pytest.raises(SystemExit):
        guarded(body, "cpu", {"device": None})
    assert capsys.readouterr().err == ""


def test_guarded_lets_a_bug_through(one_rank):
    def body(device, args):
        raise ZeroDivisionError("a bug, with its traceback")

    with pytest.raises(ZeroDivisionError):
        guarded(body, "cpu", {"device": None})


def test_run_on_ranks_runs_a_single_process_job_here(one_rank):
    seen = []
    run_on_ranks(lambda device, args: seen.append(device), None, "gloo", 1.0, {"device": "cpu"})
    assert seen == ["cpu"]


def test_devices_are_refused_inside_a_launched_job(one_rank, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(InputError, match="--devices spawns its own ranks"):
        run_on_ranks(lambda device, args: None, "cpu,cpu", "gloo", 1.0, {"device": None})
