"""The CLI's default STS data folder (``--data-dir`` not given): ``$BERTFLOW_DATA_DIR``, then ./shared/data/sts,
../shared/data/sts (relative to the working directory) and ~/.cache/bertflow/sts. The library searches nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertflow.cli.evaluate import DATA_DIR_CANDIDATES, find_data_dir
from bertflow.errors import DataNotFoundError
from bertflow.evaluation.datasets import DATA_DIR_ENV


def test_find_data_dir_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    explicit = tmp_path / "explicit"
    explicit.mkdir()
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    monkeypatch.setenv(DATA_DIR_ENV, str(env_dir))
    assert find_data_dir(explicit) == explicit.resolve()
    assert find_data_dir(None) == env_dir.resolve()

    monkeypatch.delenv(DATA_DIR_ENV)
    home = tmp_path / "home"
    (home / ".cache/bertflow/sts").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "repo" / "sub"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    assert find_data_dir(None) == (home / ".cache/bertflow/sts").resolve()
    (tmp_path / "repo" / "shared/data/sts").mkdir(parents=True)
    assert find_data_dir(None) == (tmp_path / "repo/shared/data/sts").resolve()
    (work / "shared/data/sts").mkdir(parents=True)
    found = find_data_dir(None)
    assert found == (work / "shared/data/sts").resolve() and found.is_absolute()


def test_find_data_dir_missing_explains_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataNotFoundError) as info:
        find_data_dir(None)
    message = str(info.value)
    for hint in ("--data-dir", DATA_DIR_ENV, "bertflow download-sts", "download_sts()"):
        assert hint in message
    with pytest.raises(DataNotFoundError, match="does not exist"):
        find_data_dir(tmp_path / "nope")
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "nope"))
    with pytest.raises(DataNotFoundError, match=DATA_DIR_ENV):
        find_data_dir(None)
    assert isinstance(info.value, FileNotFoundError)


def test_the_option_help_lists_the_search(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from bertflow.cli import app

    out = CliRunner().invoke(app, ["evaluate", "--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"}).output
    flat = " ".join(out.replace("│", " ").split())
    assert DATA_DIR_ENV in flat and all(c in flat for c in DATA_DIR_CANDIDATES)
