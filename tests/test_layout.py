"""The test tree mirrors the package (issue 22 item 9): the tests of ``src/bertflow/<package path>/<module>.py`` live
in ``tests/<package path>/test_<module>.py``. A module without that file must be listed below, with the reason, and,
for a module tested through other files, which files: the list is the to-do list of the mirror. An entry that is no
longer needed (the module got its file, or is gone) or that names a test file that does not exist fails too, so the
list stays honest as modules and tests move. The package's functions and modules also stay within issue 22's size
bounds (:func:`test_no_function_or_module_over_the_size_bounds`)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "bertflow"
TESTS = ROOT / "tests"

#: Modules that get no test file of their own, for good: nothing to test apart from where they are used.
#: (Every ``__init__.py`` is exempt as well: they only re-export; tests/test_imports.py checks the public names.)
NO_TEST_FILE: dict[str, str] = {
    "_version.py": "the version string the build writes; tests/test_wheel.py checks the installed one",
    "typing.py": "type aliases only, no code that runs",
}

#: To do: modules tested only through other test files (listed), which should get ``test_<module>.py``.
TESTED_ELSEWHERE: dict[str, tuple[str, ...]] = {
    # The entry point: run as ``python -m bertflow`` by the end-to-end safety tests and by torchrun.
    "__main__.py": ("cli/test_app.py", "cli/test_encode.py", "scale/test_multiprocess.py"),
}


def modules() -> list[str]:
    """Every module of the package, as a path relative to ``src/bertflow`` (``"scale/encode.py"``), sorted."""
    return sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py"))


def mirror(module: str) -> Path:
    """``"scale/encode.py"`` -> ``tests/scale/test_encode.py``; a private module's underscore is dropped
    (``"cli/_app.py"`` -> ``tests/cli/test_app.py``), not a dunder's."""
    path = Path(module)
    name = path.name[1:] if path.name.startswith("_") and not path.name.startswith("__") else path.name
    return TESTS / path.parent / f"test_{name}"


def test_every_module_has_its_test_file_or_is_listed():
    missing = [
        f"{module} -> {mirror(module).relative_to(ROOT)}"
        for module in modules()
        if Path(module).name != "__init__.py"
        and module not in NO_TEST_FILE
        and module not in TESTED_ELSEWHERE
        and not mirror(module).is_file()
    ]
    assert not missing, "modules without their test file (add it, or list the module here with why):\n" + "\n".join(
        missing
    )


def test_the_lists_name_only_modules_that_need_them():
    listed = [*NO_TEST_FILE, *TESTED_ELSEWHERE]
    assert len(listed) == len(set(listed)), "a module is listed twice"
    present = set(modules())
    gone = [module for module in listed if module not in present]
    assert not gone, f"listed modules that no longer exist (remove them from the lists): {gone}"
    done = [module for module in listed if mirror(module).is_file()]
    assert not done, f"listed modules that now have their test file (remove them from the lists): {done}"


def test_the_files_named_as_testing_a_module_exist():
    absent = [f"{module}: tests/{name}" for module, names in TESTED_ELSEWHERE.items() for name in names]
    absent = [entry for entry in absent if not (TESTS / entry.split(": tests/")[1]).is_file()]
    assert not absent, "test files named in TESTED_ELSEWHERE that do not exist:\n" + "\n".join(absent)


#: Issue 22's bounds (items 8 and "done means"): a function longer than this is split into plan -> run -> summarise,
#: a module longer than this into one module per job.
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500


def test_no_function_or_module_over_the_size_bounds():
    """Every function and method of the package (its ``def`` line to its last line, docstring included) is at most
    :data:`MAX_FUNCTION_LINES` long and every module at most :data:`MAX_MODULE_LINES` (as ``wc -l`` counts)."""
    import ast

    long_functions, long_modules = [], []
    for module in modules():
        source = (PACKAGE / module).read_text(encoding="utf-8")
        if len(source.splitlines()) > MAX_MODULE_LINES:
            long_modules.append(f"{module} ({len(source.splitlines())} lines)")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long_functions.append(f"{module}:{node.lineno} {node.name} ({lines} lines)")
    assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines: {long_functions}"
    assert not long_modules, f"modules over {MAX_MODULE_LINES} lines: {long_modules}"
