"""CLI help texts derive from the single source: ``--pooling`` lists the pooling registry's names, ``--dtype``,
``--weighting``, ``--backend``, regimes and distributed-fit's calibrators the lists their owners hold."""

from __future__ import annotations

from typer.testing import CliRunner

from bertflow.cli import app
from bertflow.cli.options import declared_poolings

runner = CliRunner()


def test_pooling_help_lists_every_registered_pooling() -> None:
    from bertflow.encoding.pooling import registered_poolings

    registered = [name for kind in registered_poolings() for name in kind.names]
    assert declared_poolings() == registered and {"mean", "cls", "first-last-avg"} <= set(registered)
    from typer.testing import CliRunner

    from bertflow.cli import app

    out = CliRunner().invoke(app, ["fit", "--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"}).output
    flat = " ".join(out.replace("│", " ").split())
    assert " | ".join(registered) in flat


def test_help_shows_no_bool_metavar_after_flags():
    for command in (["encode", "--help"], ["fit", "--help"], ["--help"]):
        text = runner.invoke(app, command).stdout
        flagged = [line for line in text.splitlines() if "<bool>" in line and "--help" not in line]
        assert not flagged, flagged


def test_calibrator_help_lists_every_spec():
    import typer

    from bertflow.calibrators import calibrator_specs

    commands = typer.main.get_command(app).commands
    for name, option in (("fit", "calibrator"), ("evaluate", "calibrator")):
        (param,) = [p for p in commands[name].params if p.name == option]
        listed = param.help.split(",")[0].split(" | ")
        assert listed == list(calibrator_specs()), name  # "anchored", "anchored-P", "auto" among them


def test_help_has_examples():
    for cmd in ("fit", "encode", "similarity"):
        r = runner.invoke(app, [cmd, "--help"])
        assert r.exit_code == 0 and "Examples" in r.stdout


def _option_help(command: str, option: str) -> str:
    import typer

    from bertflow.cli import app

    commands = typer.main.get_command(app).commands
    if " " in command:  # a subcommand group: "search query"
        group, sub = command.split()
        commands = commands[group].commands
        command = sub
    (param,) = [p for p in commands[command].params if p.name == option]
    return param.help


def test_source_constant_reads_what_the_owner_module_holds() -> None:
    import pytest

    from bertflow.cli.options import source_constant
    from bertflow.encoding import device
    from bertflow.encoding.pooling import weighting

    assert source_constant("encoding/device", "DTYPE_NAMES") == device.DTYPE_NAMES
    assert source_constant("encoding/pooling/weighting", "WEIGHTING_NAMES") == weighting.WEIGHTING_NAMES
    assert source_constant("encoding/pooling/weighting", "SIF_A") == weighting.SIF_A
    with pytest.raises(LookupError, match="NO_SUCH"):
        source_constant("encoding/device", "NO_SUCH")


def test_dtype_weighting_and_backend_help_list_the_owners_names() -> None:
    from bertflow.encoding.device import DTYPE_NAMES
    from bertflow.encoding.pooling.weighting import SIF_A, WEIGHTING_NAMES
    from bertflow.search.ann import APPROXIMATE_KINDS, AUTO_APPROXIMATE_MIN_ROWS, AUTO_MIN_RECALL, BACKENDS

    for command in ("fit", "encode", "search build", "distributed-encode"):
        assert ", ".join(DTYPE_NAMES) in _option_help(command, "dtype"), command
    assert " | ".join(WEIGHTING_NAMES) in _option_help("fit", "weighting")
    assert f"a={SIF_A}" in _option_help("fit", "weighting")
    assert BACKENDS == ("torch", "faiss") and " or ".join(BACKENDS) in _option_help("search query", "backend")
    approximate = _option_help("search build", "approximate")
    assert ", ".join(APPROXIMATE_KINDS) in approximate and f"{AUTO_APPROXIMATE_MIN_ROWS:,} rows" in approximate
    assert f"at least {AUTO_MIN_RECALL}," in approximate


def test_every_dtype_name_and_alias_resolves() -> None:
    import pytest
    import torch

    from bertflow.encoding.device import DTYPE_ALIASES, DTYPE_NAMES, resolve_dtype
    from bertflow.errors import InputError

    cpu = torch.device("cpu")
    for name in DTYPE_NAMES:
        assert resolve_dtype(name, cpu) == getattr(torch, name)
    for alias, name in DTYPE_ALIASES.items():
        assert resolve_dtype(alias, cpu) == getattr(torch, name)
    assert resolve_dtype("auto", cpu) == torch.float32
    with pytest.raises(InputError, match=r"use auto, float32, bfloat16 or float16$"):
        resolve_dtype("int8", cpu)


def test_distributed_fit_lists_its_specs_from_the_registry() -> None:
    from bertflow.calibrators import calibrator_specs
    from bertflow.cli.distributed_fit import distributed_specs

    specs = distributed_specs()
    assert specs == ["flow", "flow-paper", "whitening", "whitening-K"]
    assert set(specs) <= set(calibrator_specs())
    assert _option_help("distributed-fit", "calibrator") == " | ".join(specs) + "."


def test_regime_and_paper_model_help_come_from_the_paper_package() -> None:
    from bertflow.paper.published import PAPER_MODELS
    from bertflow.paper.regimes import REGIME_TEXT, REGIMES

    regime = _option_help("evaluate", "regime")
    assert all(f"{name} ({REGIME_TEXT[name]})" in regime for name in REGIMES) and "per-set" in regime
    assert ", ".join(REGIMES) in _option_help("reproduce", "regimes")
    assert " or ".join(PAPER_MODELS) in _option_help("reproduce", "paper_rows")


def test_text_column_help_names_the_readers_default() -> None:
    from bertflow.io.arrow import DEFAULT_TEXT_COLUMN

    for command in ("encode", "distributed-encode"):
        assert f"(default: {DEFAULT_TEXT_COLUMN})" in _option_help(command, "text_column"), command
