"""benchmarks/source_size.py: each line of a module counted once, as code, docstring, comment or blank."""

from __future__ import annotations

import json
import subprocess
import sys

import source_size

from .conftest import BENCHMARKS

MODULE = '''"""A module's docstring,
on two lines."""

import os  # a trailing comment keeps the line code


class A:
    """One line."""

    # a comment line
    def f(self):
        """Docstring
        of a method."""
        x = "not a docstring"
        return x
'''


def test_each_line_has_one_kind():
    kinds = source_size.line_kinds(MODULE)
    assert len(kinds) == len(MODULE.splitlines())
    assert kinds[:2] == ["docstring", "docstring"]
    assert kinds[3] == "code" and kinds[7] == "docstring" and kinds[9] == "comment"
    assert kinds[11:13] == ["docstring", "docstring"] and kinds[13:] == ["code", "code"]
    assert kinds.count("blank") == 4


def test_packages_and_total_add_up(tmp_path):
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "top.py").write_text(MODULE)
    (root / "sub" / "inner.py").write_text("x = 1\n\n# done\n")
    out = tmp_path / "size.json"
    subprocess.run([sys.executable, BENCHMARKS / "source_size.py", "--root", root, "--json", out], check=True)
    table = json.loads(out.read_text())
    assert table["pkg"]["lines"] == 15 and table["sub"] == {
        "lines": 3,
        "modules": 1,
        "code": 1,
        "docstring": 0,
        "comment": 1,
        "blank": 1,
    }
    assert table["total"]["lines"] == 18 and table["total"]["modules"] == 2
    assert sum(table["total"][k] for k in source_size.KINDS) == table["total"]["lines"]
