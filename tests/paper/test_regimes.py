"""Which sentences each fitting regime (bertflow.paper.regimes) fits on."""

# ruff: noqa: F811 - the fixture imported from tests/sts_layout.py is redefined as a parameter
from __future__ import annotations

from pathlib import Path

import pytest

from bertflow.errors import InputError
from bertflow.evaluation.datasets import STS_TASKS, load_nli_sentences, load_sts_tasks
from bertflow.paper.regimes import fitting_sets

from ..sts_layout import layout  # noqa: F401 - fixture


def test_fitting_sets_per_regime(layout: Path) -> None:
    tasks = load_sts_tasks(STS_TASKS, layout)
    target = fitting_sets("target", tasks)
    assert not target.shared and target.per_task["STS-B"] == tasks["STS-B"].fit_sentences("target")
    assert set(tasks["STS12"].eval_sentences()) <= set(target.per_task["STS12"])
    train = fitting_sets("train", tasks)
    assert train.per_task["STS12"] is None and train.per_task["SICK-R"] == tasks["SICK-R"].fit_sentences("train")
    nli = load_nli_sentences(layout)
    shared = fitting_sets("nli", tasks, nli=nli)
    assert shared.shared and all(v == nli for v in shared.per_task.values())
    with pytest.raises(InputError, match="--corpus"):
        fitting_sets("corpus", tasks)
    with pytest.raises(InputError, match="unknown regime"):
        fitting_sets("test", tasks)
