"""Safe files on disk: atomic file and folder writes, output-path checks, folder locks.

A save never leaves a half-written model, index or store where a reader can see it, and an output path that holds
something else is refused, not replaced.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import struct
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

import numpy as np

from ..errors import BertflowError, ModelFileError, OutputError

T = TypeVar("T")


#: Marks the name of a file being written (``.NAME.tmp-HOST-PID``): a stale one, left by a killed writer, is found
#: by it and removed by the code that owns the folder.
TMP_MARK = ".tmp-"


def temporary_name(path: Path) -> Path:
    """A hidden name beside ``path`` to write it under before the rename (host and pid: whose it is)."""
    return path.with_name(f".{path.name}{TMP_MARK}{socket.gethostname()}-{os.getpid()}")


def fsync_dir(folder: Path) -> None:
    """Make a rename inside ``folder`` durable (a no-op where directories cannot be opened, e.g. Windows)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
    """Write ``path`` through a temporary file beside it (``mode``, ``kwargs`` as for :func:`open`), fsynced and
    renamed over ``path`` when the block ends: readers see the old file or the whole new one."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        with open(tmp, mode, **kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` as UTF-8, atomically."""
    with atomic_file(path, "w", encoding="utf-8") as fh:
        fh.write(text)


#: What makes a folder bertflow's own, per kind: the JSON file it holds, and the key and value that file carries.
FOLDER_KINDS: dict[str, tuple[str, str, str]] = {
    "model": ("bertflow_config.json", "library", "bertflow"),
    "index": ("index.json", "format", "bertflow-index"),
    "store": ("manifest.json", "format", "bertflow-embeddings"),
}

#: Files a save writes besides its marker and the files the marker's ``files`` checksums list (the model card).
_UNLISTED_OWN_FILES: dict[str, tuple[str, ...]] = {"model": ("README.md",), "index": ()}

_KIND_NAMES = {"model": "a bertflow model", "index": "a bertflow search index", "store": "a bertflow embedding store"}


def _beside(target: Path, role: str) -> Path:
    """The hidden name beside the folder ``target`` for ``role``: ``new``, ``old``, ``lock``."""
    return target.with_name(f".{target.name}.bertflow-{role}")


def moved_aside(target: str | Path) -> Path | None:
    """The previous version of ``target`` moved aside by a save between its two renames (running or killed there),
    when ``target`` itself is missing; ``None`` otherwise."""
    target = Path(target).expanduser()
    if target.exists() or target.is_symlink():
        return None
    old = _beside(target, "old")
    return old if old.is_dir() else None


def folder_present(target: str | Path) -> bool:
    """Whether the folder ``target`` is there, counting a save between its two renames (:func:`moved_aside`) as
    there. ``is_dir`` is asked twice: a folder missing at the first look and without an aside at the second was
    renamed in meanwhile."""
    target = Path(target).expanduser()
    return target.is_dir() or moved_aside(target) is not None or target.is_dir()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_directory(target: str | Path) -> Iterator[Path]:
    """Yield a new empty folder beside ``target``; when the block ends its files are fsynced and it takes
    ``target``'s place (old renamed to ``.NAME.bertflow-old``, new renamed in, old deleted only then; a kill between
    the renames is named by :func:`read_folder` and :func:`check_output_folder`). One save of ``target`` at a time
    (an OS lock on ``.NAME.bertflow-lock``), so the next save removes what a killed one left. An exception in the
    block leaves ``target`` as it was.
    """
    target = Path(target).expanduser().resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    new, old = _beside(target, "new"), _beside(target, "old")
    with folder_lock(target, "save", _beside(target, "lock")):
        # What a killed save of target left: no other save of it runs now. The old folder only once target is a
        # complete folder again (else it is the only copy, and stays until the new one is in place).
        _remove(new)
        if target.is_dir():
            _remove(old)
        os.mkdir(new)  # files and folders made in it follow the umask, as a plain save would
        try:
            yield new
            for f in new.rglob("*"):
                if f.is_file():
                    with open(f, "rb") as fh:
                        os.fsync(fh.fileno())
            fsync_dir(new)
            if target.is_dir():
                os.rename(target, old)
            try:
                os.rename(new, target)
            except BaseException:
                if old.is_dir() and not target.exists():
                    os.rename(old, target)  # put the old folder back before reporting the failure
                raise
        except BaseException:
            shutil.rmtree(new, ignore_errors=True)
            raise
        fsync_dir(target.parent)
        shutil.rmtree(old, ignore_errors=True)


def _folder_identity(folder: Path) -> tuple[int, int, int] | None:
    """What changes when a save renames another folder to ``folder``'s name, or ``None`` if missing."""
    try:
        st = folder.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def read_folder(folder: str | Path, read: Callable[[Path], T]) -> T:
    """``read(folder)``, or one clear :class:`ModelFileError` where another process's save replaced the folder during
    the read or moved it aside."""
    folder = Path(folder)

    def aside_error(aside: Path) -> ModelFileError:
        return ModelFileError(
            f"{folder} is missing and its previous version is in {aside}: a save into it is under way or was killed; "
            f"load again in a moment, or, if no save is running, rename it back (mv {aside} {folder}) or save again"
        )

    replaced = f"{folder} was replaced by another save while it was being read; load it again"
    aside = moved_aside(folder)
    if aside is not None:
        raise aside_error(aside)
    before = _folder_identity(folder)
    try:
        result = read(folder)
    except (BertflowError, OSError) as e:
        aside = moved_aside(folder)
        if aside is not None:
            raise aside_error(aside) from e
        if _folder_identity(folder) != before:
            raise ModelFileError(replaced) from e
        raise
    if _folder_identity(folder) != before:
        raise ModelFileError(replaced)
    return result


def folder_kind(folder: Path) -> str | None:
    """Which bertflow folder ``folder`` is (``"model"``, ``"index"``, ``"store"``), or None for anything else."""
    for kind, (marker, key, value) in FOLDER_KINDS.items():
        file = folder / marker
        if file.is_file():
            try:
                data = json.loads(file.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError):
                continue
            if isinstance(data, dict) and data.get(key) == value:
                return kind
    return None


def foreign_entries(folder: Path, kind: str) -> list[str]:
    """What ``--overwrite`` would delete in the bertflow folder ``folder`` of ``kind`` (``"model"``, ``"index"``):
    entries its save did not write (not the marker, a file its checksums list or the card), relative paths, a
    foreign sub-folder named once (``notes/``), sorted."""
    marker = FOLDER_KINDS[kind][0]
    owned = {marker, *_UNLISTED_OWN_FILES[kind]}
    try:
        files = json.loads((folder / marker).read_text(encoding="utf-8")).get("files")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        files = None
    if isinstance(files, dict):
        owned |= {str(name) for name in files}
    # Every folder on the way to an owned file is owned too; anything else is reported at its top-most foreign part.
    owned_dirs = {"/".join(name.split("/")[:i]) for name in owned for i in range(1, name.count("/") + 1)}
    found: set[str] = set()
    for root, dirs, names in os.walk(folder):
        rel_root = Path(root).relative_to(folder).as_posix()
        prefix = "" if rel_root == "." else rel_root + "/"
        for d in list(dirs):
            if prefix + d not in owned_dirs:
                found.add(prefix + d + "/")
                dirs.remove(d)  # named once, not file by file
        for name in names:
            rel = prefix + name
            if rel not in owned and rel != LOCK_NAME:
                found.add(rel)
    return sorted(found)


def _probe_writable(folder: Path, what: str) -> None:
    """Create and delete a file in ``folder``: the one test that also holds for root and read-only mounts."""
    probe = temporary_name(folder / ".bertflow-probe")
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError as e:
        raise OutputError(f"cannot write {what}: {folder} is not writable ({e.strerror or e})") from None
    os.close(fd)
    probe.unlink(missing_ok=True)


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_output_folder(
    path: str | Path,
    kind: str,
    *,
    overwrite: bool = False,
    inputs: Sequence[str | Path] = (),
    resume: bool = False,
) -> Path:
    """Check, before any work, that a folder of ``kind`` (:data:`FOLDER_KINDS`) may be written at ``path``;
    returns it resolved.

    Refused (:class:`OutputError`, naming the problem): the working directory or above; a folder that is or holds
    one of ``inputs``; a file; a non-empty folder that is not a bertflow folder of ``kind``; one that is, unless
    ``overwrite`` (or ``resume``: a store continued); a model or index holding files its save did not write
    (:func:`foreign_entries`), even with ``overwrite``; a place that cannot be written.
    """
    if kind not in FOLDER_KINDS:
        raise ValueError(f"unknown folder kind {kind!r}")
    name = _KIND_NAMES[kind]
    target = Path(path).expanduser().resolve()
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        raise OutputError(
            f"refusing to write {name} to {path}: it is the working directory (or holds it), which it would replace; "
            "give a new folder name"
        )
    for item in inputs:
        source = Path(item).expanduser()
        if source.exists() and (source.resolve() == target or target in source.resolve().parents):
            raise OutputError(
                f"refusing to write {name} to {path}: it holds the input {item}, which it would replace; "
                "give a new folder name"
            )
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise OutputError(f"cannot write {name} to {path}: it exists and is not a folder")
    # Between the two renames of a killed save the folder is missing and its old version, beside it, is replaced.
    aside = moved_aside(target) if kind != "store" else None
    if (aside or target).is_dir():
        _check_replaceable(aside or target, path, kind, overwrite=overwrite or resume, aside=aside)
    parent = _nearest_existing(target.parent)
    if not parent.is_dir():
        raise OutputError(f"cannot write {name} to {path}: {parent} is not a folder")
    _probe_writable(parent, f"{name} to {path}")
    return target


def _check_replaceable(existing: Path, path: str | Path, kind: str, *, overwrite: bool, aside: Path | None) -> None:
    """:func:`check_output_folder` for the existing folder ``existing`` at ``path`` (or moved aside, ``aside``)."""
    name = _KIND_NAMES[kind]
    try:
        entries = sorted(p.name for p in existing.iterdir() if p.name != LOCK_NAME)
    except OSError as e:
        raise OutputError(f"cannot write {name} to {path}: {e.strerror or e}") from None
    if not entries:
        return
    found = folder_kind(existing)
    if found != kind:
        what = (
            _KIND_NAMES[found]
            if found
            else f"other files ({', '.join(entries[:5])}{', ...' if len(entries) > 5 else ''})"
        )
        raise OutputError(
            f"refusing to write {name} to {path}: the folder is not empty and holds {what}; give a new or empty folder"
        )
    if not overwrite:
        where = f" (moved aside to {aside} by a save that was killed)" if aside else ""
        raise OutputError(f"{path} already holds {name}{where}; pass --overwrite (overwrite=True) to replace it")
    foreign = foreign_entries(existing, kind) if kind in _UNLISTED_OWN_FILES else []
    if foreign:
        # A save replaces the whole folder: what bertflow did not write would go with it. Refused, not carried over,
        # so that a model folder holds exactly what its checksums cover.
        listed = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise OutputError(
            f"refusing to replace {name} in {path}: it also holds {len(foreign)} entr"
            f"{'y' if len(foreign) == 1 else 'ies'} bertflow did not write ({listed}), which the save would "
            "delete; move them out of the folder or write to a new one"
        )


#: Bytes of the header of the embedding ``.npy`` files bertflow writes (``encode -o``). Fixed, so the row count can
#: be filled in after one pass, and 192 rather than the 128 that ``numpy.save`` gives any float32 matrix (its header
#: text fits in 128), so that a file of this layout is recognisably bertflow's (:func:`written_by_bertflow`).
NPY_HEADER_BYTES = 192

#: The first column of the TSV that ``similarity --pairs -o`` writes, alone (one model) or as the prefix of
#: ``cosine:NAME`` (one column per model when several are compared): how bertflow recognises it.
PAIRS_TSV_FIRST_COLUMN = "cosine"


def embeddings_npy_header(rows: int, dim: int) -> bytes:
    """A version 1.0 ``.npy`` header for float32 ``[rows, dim]`` (C order), padded to :data:`NPY_HEADER_BYTES`."""
    descr = np.lib.format.dtype_to_descr(np.dtype(np.float32))
    text = f"{{'descr': {descr!r}, 'fortran_order': False, 'shape': ({rows}, {dim}), }}"
    body = text.ljust(NPY_HEADER_BYTES - 10 - 1) + "\n"
    return np.lib.format.MAGIC_PREFIX + bytes([1, 0]) + struct.pack("<H", len(body)) + body.encode("latin1")


def written_by_bertflow(path: str | Path) -> bool:
    """Whether ``path`` is an embedding ``.npy`` with bertflow's header (float32 ``[N, D]``, size matching) or a
    ``similarity --pairs`` TSV (first column ``cosine[:NAME]``), which bertflow may replace."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(NPY_HEADER_BYTES)
            size = os.fstat(fh.fileno()).st_size
    except OSError:
        return False
    if head.startswith(np.lib.format.MAGIC_PREFIX):
        try:  # the header embeddings_npy_header writes, byte for byte, and as many rows as the size holds
            rows, dim = np.lib.format.read_array_header_1_0(io.BytesIO(head[8:]))[0]
        except (ValueError, SyntaxError):
            return False
        return head == embeddings_npy_header(rows, dim) and size == NPY_HEADER_BYTES + 4 * rows * dim
    column = head.split(b"\n", 1)[0].rstrip(b"\r").split(b"\t", 1)[0]
    mark = PAIRS_TSV_FIRST_COLUMN.encode()
    return column == mark or (column.startswith(mark + b":") and len(column) > len(mark) + 1)


def check_output_file(
    path: str | Path,
    *,
    inputs: Sequence[str | Path] = (),
    create_parents: bool = False,
    overwrite: bool = True,
) -> Path:
    """Check, before any work, that a file may be written at ``path`` (returned): not one of ``inputs`` (also
    through links), not a folder, in an existing writable folder (``create_parents``: under one). Without
    ``overwrite`` an existing file is replaced only if :func:`written_by_bertflow`. Raises OutputError."""
    target = Path(path).expanduser()
    for item in inputs:
        source = Path(item).expanduser()
        same = source.resolve() == target.resolve()
        if not same and source.exists() and target.exists():
            with contextlib.suppress(OSError):
                same = os.path.samefile(source, target)
        if same:
            raise OutputError(f"refusing to write {path}: it is the input {item}, which it would replace")
    if target.is_dir():
        raise OutputError(f"cannot write {path}: it is a folder; give a file name")
    if not overwrite and target.exists() and not written_by_bertflow(target):
        raise OutputError(
            f"refusing to replace {path}: it exists and is not an output bertflow wrote; pass --overwrite to replace "
            "it, or give a new file name"
        )
    parent = _nearest_existing(target.parent) if create_parents else target.parent
    if not parent.exists():
        raise OutputError(f"cannot write {path}: the folder {parent} does not exist")
    if not parent.is_dir():
        raise OutputError(f"cannot write {path}: {parent} is not a folder")
    _probe_writable(parent, str(path))
    return target


#: The lock file of a folder that one run at a time may write (see :func:`folder_lock`).
LOCK_NAME = ".lock"


@contextlib.contextmanager
def folder_lock(place: str | Path, what: str, path: Path | None = None) -> Iterator[None]:
    """Hold the lock file ``path`` (default ``PLACE/.lock``; ``filelock``'s OS lock: free at once when its holder
    dies) while ``what`` runs on ``place``; a second run gets an :class:`OutputError` at once naming the holder's
    host and pid."""
    from filelock import FileLock, Timeout

    path = path or Path(place) / LOCK_NAME
    lock = FileLock(path, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        owner = ""
        with contextlib.suppress(OSError):
            owner = path.read_text(encoding="utf-8").strip()
        raise OutputError(
            f"{place} is in use by another {what} (process {owner or 'unknown'}, lock file {path}); wait for it "
            "to finish"
        ) from None
    try:
        path.write_text(f"{socket.gethostname()}-{os.getpid()}\n", encoding="utf-8")
        yield
    finally:
        # Removed while still held: a run that opened the old file before finds it unlinked and takes a new one.
        with contextlib.suppress(OSError):
            path.unlink()
        lock.release()
