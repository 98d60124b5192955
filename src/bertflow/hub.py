"""The Hugging Face Hub as a place models come from and go to: telling a repo id from a local path, fetching a
snapshot, explaining a name that is neither (a typo of a local folder is answered as such, not with a network
error), and publishing a saved model folder.

huggingface_hub is imported only when something is fetched or published.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import InputError, ModelFileError, OutputError
from .validation import means_local

if TYPE_CHECKING:
    from .embedder import Embedder


def is_hub_id(name: str) -> bool:
    """Whether ``name`` reads as a hub repo id (``org/name`` or ``name``) rather than a local path."""
    return bool(re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name)) and not Path(name).expanduser().exists()


def snapshot(
    repo_id: str, revision: str | None, allow_patterns: list[str] | None = None, *, token: bool | str | None = None
) -> Path:
    """A hub repo's files via huggingface_hub (its cache first); ModelFileError saying why and what to try."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=allow_patterns, token=token))
    except Exception as e:  # huggingface_hub raises many types: offline, not found, gated, invalid id, HTTP
        why = _why(
            e,
            "HF_HUB_OFFLINE is set and it is not in the local cache: unset HF_HUB_OFFLINE where there is network, "
            f"or download it first (hf download {repo_id})",
            "check the repo id and revision, your network, and (for a private or gated repo) `hf auth login`",
        )
        raise ModelFileError(f"{repo_id!r} could not be fetched from the Hugging Face Hub {why}") from None


def download_model(name: str, revision: str | None) -> Path:
    """Fetch a bertflow model folder from the Hugging Face Hub, or explain (ModelFileError) why ``name`` is neither
    folder nor repo: a file, a local folder that does not exist, no repo id, or a repo that could not be fetched."""
    path = Path(name).expanduser()
    if path.exists():
        raise ModelFileError(f"{path} is a file; a bertflow model is a folder (written by Embedder.save)")
    if means_local(name):
        raise ModelFileError(f"no such folder: {name} (looked in {Path.cwd()}){did_you_mean(path)}")
    if not is_hub_id(name):
        raise ModelFileError(
            f"no folder {path} (looked in {Path.cwd()}), and {name!r} is not a Hugging Face Hub repo id either"
        )
    try:
        return snapshot(name, revision)
    except ModelFileError as e:
        raise ModelFileError(f"no such folder {name!r} here, and {e}") from None


def did_you_mean(path: Path) -> str:
    """``"; did you mean X?"`` naming the closest existing folder next to ``path``, or ``""``."""
    import difflib

    parent = path.parent
    try:
        siblings = [p.name for p in parent.iterdir() if p.is_dir()] if parent.is_dir() else []
    except OSError:
        return ""
    close = difflib.get_close_matches(path.name, siblings, n=1, cutoff=0.75)
    return f"; did you mean {parent / close[0]}?" if close else ""


def check_repo_id(repo_id: str) -> None:
    """Refuse (InputError) a ``repo_id`` that cannot name a model repo to publish to (``user/name``)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
        if "/" not in repo_id:
            raise HFValidationError("it has no owner")
    except HFValidationError as e:
        raise InputError(f"repo_id must read 'user/name' or 'org/name', got {repo_id!r} ({e})") from None


def upload_folder(
    folder: Path,
    repo_id: str,
    *,
    private: bool | None = None,
    token: str | None = None,
    revision: str | None = None,
    commit_message: str,
) -> str:
    """Upload ``folder`` to the model repo ``repo_id`` in one commit (``HfApi.create_repo`` with ``exist_ok``, a
    ``revision`` branch created if missing, then ``HfApi.upload_folder``); returns the commit's URL.
    ``private`` applies only to a repo created now."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, token=token, private=private, repo_type="model", exist_ok=True)
        if revision is not None:
            api.create_branch(repo_id, branch=revision, token=token, repo_type="model", exist_ok=True)
        info = api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            token=token,
            repo_type="model",
            revision=revision,
            commit_message=commit_message,
        )
    except Exception as e:  # huggingface_hub raises many types: offline, no token, forbidden, HTTP
        why = _why(
            e,
            "HF_HUB_OFFLINE is set: unset it where there is network",
            "check your network, the repo id, and that `hf auth login` (or token=) gives write access",
        )
        raise OutputError(f"cannot push to {repo_id!r} on the Hugging Face Hub {why}") from None
    return str(getattr(info, "commit_url", info))


def push(
    embedder: Embedder,
    repo_id: str,
    *,
    private: bool | None = None,
    token: str | None = None,
    revision: str | None = None,
    commit_message: str = "Upload bertflow model",
    include_encoder: bool = False,
) -> str:
    """Publish a fitted ``embedder`` on the Hugging Face Hub (``repo_id`` ``"user/name"``), where ``Embedder.load``
    and ``--model-dir`` fetch it; returns the commit's URL.

    Saved as by ``Embedder.save`` into a temporary folder, which :func:`upload_folder` sends in one commit to
    ``revision`` (a branch, created if missing); ``token`` defaults to ``hf auth login``'s or ``HF_TOKEN``. Before
    anything is created on the Hub: NotFittedError, or InputError for a bad ``repo_id`` or a local encoder without
    ``include_encoder``. OutputError: the Hub could not be reached or refused the upload.
    """
    import tempfile

    from .encoding.loading import local_encoder_dir

    embedder.check_fitted()
    check_repo_id(repo_id)
    if not include_encoder and local_encoder_dir(embedder.encoder) is not None:
        raise InputError(
            f"the encoder is the local folder {embedder.encoder.model_id!r}, which a model on the Hub cannot name: "
            "push with include_encoder=True (mind the encoder's licence) or fit on a Hub id"
        )
    source = embedder.source  # save() records where it wrote; a temporary folder is no origin worth keeping
    with tempfile.TemporaryDirectory(prefix="bertflow-push-") as tmp:
        try:
            folder = embedder.save(Path(tmp) / "model", include_encoder=include_encoder)
        finally:
            embedder.source = source
        return upload_folder(
            folder, repo_id, private=private, token=token, revision=revision, commit_message=commit_message
        )


def _why(e: Exception, offline: str, online: str) -> str:
    """``"(Type: message); hint"`` for a huggingface_hub failure, on one line (its messages span lines), with the
    ``offline`` hint where ``HF_HUB_OFFLINE`` forbids network access, else the ``online`` one."""
    offline_set = os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() in ("1", "true", "yes", "on")
    return f"({type(e).__name__}: {' '.join(str(e).split())}); {offline if offline_set else online}"
