"""How large the package's source is (issue 22's size goal), by package: lines as ``wc -l`` counts them, and how
many of them are code, docstrings (a module's, class's or function's first string), comment-only lines and blank
lines. Prints a table; ``--json PATH`` also writes it.

    python benchmarks/source_size.py            # src/bertflow
    python benchmarks/source_size.py --root OTHER/src/bertflow
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import tokenize
from collections import Counter
from pathlib import Path

KINDS = ("code", "docstring", "comment", "blank")


def line_kinds(source: str) -> list[str]:
    """The kind (:data:`KINDS`) of each line of one module."""
    lines = source.splitlines()
    kinds = ["blank" if not line.strip() else "code" for line in lines]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                kinds[first.lineno - 1 : first.end_lineno] = ["docstring"] * (first.end_lineno - first.lineno + 1)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and lines[token.start[0] - 1].lstrip().startswith("#"):
            kinds[token.start[0] - 1] = "comment"
    return kinds


def measure(root: Path) -> dict[str, dict[str, int]]:
    """``{package: {"lines": wc -l, "modules": n, kind: lines}}`` for each package under ``root`` (modules directly
    in ``root`` under its own name), and ``"total"``."""
    table: dict[str, Counter[str]] = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        package = relative.parts[0] if len(relative.parts) > 1 else root.name
        source = path.read_text(encoding="utf-8")
        counts = table.setdefault(package, Counter())
        counts.update(line_kinds(source))
        counts["lines"] += len(source.splitlines())
        counts["modules"] += 1
    table["total"] = sum(table.values(), Counter())
    return {name: {key: counts[key] for key in ("lines", "modules", *KINDS)} for name, counts in table.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1] / "src" / "bertflow")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    table = measure(args.root)
    print(f"{'package':<14}{'lines':>8}{'modules':>9}" + "".join(f"{kind:>11}" for kind in KINDS))
    for name, row in sorted(table.items(), key=lambda item: (item[0] == "total", -item[1]["lines"])):
        print(f"{name:<14}{row['lines']:>8}{row['modules']:>9}" + "".join(f"{row[kind]:>11}" for kind in KINDS))
    if args.json is not None:
        args.json.write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
