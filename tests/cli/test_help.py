"""CLI help texts derive from the single source: ``--pooling`` lists the pooling registry's names."""

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
