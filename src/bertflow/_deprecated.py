"""Old module paths, importable for one more release with a :class:`DeprecationWarning`.

The package was reorganised into layers (``encoding/``, ``io/``, ``scale/``, ``evaluation/``). Code written against
the old flat modules keeps working: ``from bertflow.encoder import SentenceEncoder`` finds the name in its new
module and warns once per old module. Only this table and one import hook implement it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import warnings
from types import ModuleType
from typing import Any

#: old module -> the modules its public names now live in (searched in order).
MOVED: dict[str, tuple[str, ...]] = {
    "bertflow.encoder": ("bertflow.encoding.encoder",),
    "bertflow.pooling": ("bertflow.encoding.pooling",),
    "bertflow.tokenization": ("bertflow.encoding.tokenization",),
    "bertflow.pipeline": ("bertflow.embedder",),
    "bertflow.store": ("bertflow.scale.store",),
    "bertflow.serialization": ("bertflow.io.files", "bertflow.io.formats"),
    "bertflow.data": ("bertflow.io.text", "bertflow.evaluation.datasets", "bertflow.evaluation.download"),
    "bertflow.evaluation.reproduce": (
        "bertflow.evaluation.grid",
        "bertflow.evaluation.regimes",
        "bertflow.evaluation.results",
        "bertflow.evaluation.render",
        "bertflow.resources",
    ),
    "bertflow.distributed": (
        "bertflow.scale.launch",
        "bertflow.scale.encode",
        "bertflow.scale.fit",
        "bertflow.io.text",
    ),
}


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old module names (only those) and builds a module that forwards attribute lookups."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        targets = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} is deprecated and will be removed in the next release; import from {' or '.join(targets)}",
            DeprecationWarning,
            stacklevel=3,
        )
        # A module that was only renamed is the new module itself, so patching it through the old name still works.
        return importlib.import_module(targets[0]) if len(targets) == 1 else None

    def exec_module(self, module: ModuleType) -> None:
        targets = MOVED.get(module.__name__)
        if targets is None:  # a renamed module: create_module returned the new one, already executed
            return

        def __getattr__(name: str) -> Any:
            for target in targets:
                new = importlib.import_module(target)
                if hasattr(new, name):
                    return getattr(new, name)
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r} (it moved to {targets})")

        module.__getattr__ = __getattr__  # type: ignore[method-assign]


def install() -> None:
    """Put the finder at the end of ``sys.meta_path`` once (real modules are always found first)."""
    import sys

    if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
        sys.meta_path.append(_OldPaths())
