"""The automatic calibrator choice (autofit.py): what it chose and why, in the log."""

from __future__ import annotations


def test_auto_logs_what_it_chose_and_why(anisotropic_data, caplog):
    import logging

    from bertflow.calibrators import AutoCalibrator

    with caplog.at_level(logging.INFO, logger="bertflow.calibrators.auto"):
        cal = AutoCalibrator().fit(anisotropic_data)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "bertflow.calibrators.auto"]
    # What it read (the anisotropy of X here: no encoder probe), what it concluded, and the settings it chose.
    assert line.startswith("auto: embedding anisotropy ") and "reliability" in line, line
    kind = "a raw MLM encoder" if cal.rawness_ >= 0.5 else "a sentence encoder"
    assert kind in line and f"alpha {cal.alpha_:.2f}" in line, line
