"""The calibrator registry, discovered: adding a calibrator is adding one module (docs/architecture.md's recipe).

A calibrator module is any module of this package, or one named by an entry point of the group
``bertflow.calibrators``; in it, a class decorated with :func:`register` is saved and loaded under that name and
declares its ``specs`` and ``aliases`` as literal class attributes. :func:`catalogue` reads them from the modules'
*source* (no import: the CLI's help loads neither torch nor scikit-learn); :func:`get_calibrator_class` /
:func:`parse_calibrator` import the module a name or spec needs. Loading a saved calibrator goes through this
registry, never a dotted path named in a file, so a saved folder cannot make bertflow import arbitrary code.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.metadata
import importlib.util
import pkgutil
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CompatibilityError, InputError

if TYPE_CHECKING:
    from .base import Calibrator

#: Entry-point group through which other packages add calibrator modules.
ENTRY_POINT_GROUP = "bertflow.calibrators"
#: A spec's trailing number placeholder: ``whitening-K`` matches ``whitening-256``.
_NUMBERED = re.compile(r"^(?P<base>.+)-[A-Z]$")

_REGISTRY: dict[str, type[Calibrator]] = {}


@dataclass(frozen=True)
class CatalogueEntry:
    """One registered calibrator class as its module's source declares it (read without importing it)."""

    name: str  #: the registry name (the ``type`` of its saved config)
    class_name: str  #: e.g. ``"WhiteningCalibrator"``
    module: str  #: the importable module holding it
    specs: dict[str, str]  #: spec -> one line of help
    aliases: dict[str, str]  #: other spelling -> spec


def register(name: str):  # noqa: ANN201 - decorator
    """Class decorator: make a calibrator loadable by ``name`` (the ``type`` field of its saved config);
    ValueError if another class holds ``name`` already."""

    def wrap(cls: type[Calibrator]) -> type[Calibrator]:
        known = _REGISTRY.get(name)
        if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"calibrator name {name!r} is taken by {known.__module__}.{known.__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def _module_sources() -> list[tuple[str, Path]]:
    """(module name, source file) of every calibrator module: this package's, then the entry points'."""
    package = __name__.rpartition(".")[0]
    found = [
        (f"{package}.{info.name}", Path(info.module_finder.path) / f"{info.name}.py")  # type: ignore[union-attr]
        for info in pkgutil.iter_modules(importlib.import_module(package).__path__)
        if not info.ispkg and not info.name.startswith("_")
    ]
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        spec = importlib.util.find_spec(entry.module)  # finds the file; runs no module code for a top-level module
        if spec is None or not spec.origin:
            raise CompatibilityError(
                f"entry point {entry.name!r} of {ENTRY_POINT_GROUP} names {entry.module!r}, which cannot be found"
            )
        found.append((entry.module, Path(spec.origin)))
    return found


def _literal(node: ast.AST | None, what: str, where: str) -> Any:
    try:
        return ast.literal_eval(node) if node is not None else None
    except ValueError:
        raise CompatibilityError(f"{where}: {what} must be a literal, so the registry can read it unimported") from None


def _entries(module: str, source: Path) -> list[CatalogueEntry]:
    """The classes ``source`` registers, read from its syntax tree."""
    tree = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
    entries = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        names = [
            _literal(d.args[0], "the registered name", f"{source}:{node.lineno}")
            for d in node.decorator_list
            if isinstance(d, ast.Call) and getattr(d.func, "id", getattr(d.func, "attr", None)) == "register" and d.args
        ]
        if not names:
            continue
        declared: dict[str, Any] = {}
        for stmt in node.body:
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None
            target = stmt.target if isinstance(stmt, ast.AnnAssign) else target
            if isinstance(target, ast.Name) and target.id in ("specs", "aliases"):
                declared[target.id] = _literal(stmt.value, target.id, f"{source}:{stmt.lineno}")
        entries.append(
            CatalogueEntry(names[0], node.name, module, declared.get("specs") or {}, declared.get("aliases") or {})
        )
    return entries


@functools.cache
def catalogue() -> tuple[CatalogueEntry, ...]:
    """Every registered calibrator class, read from the calibrator modules' source (nothing is imported)."""
    return tuple(entry for module, source in _module_sources() for entry in _entries(module, source))


def calibrator_specs() -> dict[str, str]:
    """Every spec :func:`parse_calibrator` builds, with its line of help, in discovery order (``+`` chains them)."""
    return {spec: text for entry in catalogue() for spec, text in entry.specs.items()}


def _load(entry: CatalogueEntry) -> type[Calibrator]:
    module = importlib.import_module(entry.module)
    cls = getattr(module, entry.class_name)
    if _REGISTRY.get(entry.name) is not cls:
        raise CompatibilityError(f"{entry.module}.{entry.class_name} does not register itself as {entry.name!r}")
    return cls


def get_calibrator_class(name: str) -> type[Calibrator]:
    """The calibrator class registered as ``name``, its module imported on first use; CompatibilityError if none."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    entry = next((e for e in catalogue() if e.name == name), None)
    if entry is None:
        raise CompatibilityError(f"unknown calibrator type {name!r}; known: {', '.join(calibrator_names())}")
    return _load(entry)


def calibrator_classes() -> dict[str, type[Calibrator]]:
    """Every registered calibrator class by name (imports every calibrator module)."""
    for entry in catalogue():
        _load(entry)
    return dict(sorted(_REGISTRY.items()))


def calibrator_names() -> list[str]:
    """Names of every registered calibrator (read from the sources: nothing is imported)."""
    return sorted({e.name for e in catalogue()} | set(_REGISTRY))


def _match(part: str) -> tuple[CatalogueEntry, str, int | None]:
    """The entry declaring ``part`` (a spec, an alias, or a numbered spec with its number), the spec, the number."""
    number: int | None = None
    base, _, tail = part.rpartition("-")
    if base and tail.isascii() and tail.isdigit():  # ASCII digits only: isdigit alone accepts "²"
        number = int(tail)
    for entry in catalogue():
        spec = entry.aliases.get(part, part)
        if spec in entry.specs and not _NUMBERED.match(spec):
            return entry, spec, None
        if number is not None:
            base_spec = entry.aliases.get(base, base)
            for declared in entry.specs:
                found = _NUMBERED.match(declared)
                if found and found["base"] == base_spec:
                    return entry, declared, number
    known = ", ".join(calibrator_specs())
    raise InputError(f"unknown calibrator {part!r}; known: {known} (joined with '+')")


def parse_calibrator(spec: str, **options: Any) -> Calibrator:
    """An unfitted calibrator from a short ``spec`` (:func:`calibrator_specs`: ``"flow"``, ``"whitening-256"``,
    ``"standard-norm+natsv-6"``: ``+`` chains); ``options`` go to the calibrators that take them (the flow's
    ``seed``, ``epochs``, ``device`` ...). InputError for an unknown spec or a number out of its range."""
    parts = [p.strip().lower() for p in spec.split("+")]
    if len(parts) > 1:
        chain = get_calibrator_class("chain")
        return chain([parse_calibrator(p, **options) for p in parts])
    entry, declared, number = _match(parts[0])
    return _load(entry).from_spec(declared, number, **options)
