"""Identity and compatibility: what makes a model's vectors what they are, recorded in one way and checked in one way.

* the encoder's weight fingerprint (:func:`weights_fingerprint`), part of the encoder's record (:func:`encoder_record`)
  that an :class:`~bertflow.embedder.Embedder` (and its saved folder) keeps as ``fitted_on`` once it has fitted its
  calibrator, and a sentence-transformers ``Calibration`` module keeps for its own; the calibrator holds none;
* none of these records contains the library version (nor do a calibrator's fingerprint and identity, in
  :mod:`bertflow.calibrators.base`), so a model, an index or a half-encoded store made with one bertflow release is
  still recognised by the next;
* the check that a calibrator meets the encoder it was fitted on (:func:`check_fitted_on`), and the comparison of
  two model identities that a search index makes before it is queried (:func:`identity_differences`).

Importing this module loads no torch (only :func:`weights_fingerprint` needs it, when it runs).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .errors import CompatibilityError

if TYPE_CHECKING:
    import torch

    from .calibrators import Calibrator

__all__ = [
    "ENCODER_KEYS",
    "LATER_ENCODER_KEYS",
    "FINGERPRINT_SCHEME",
    "check_dimension",
    "check_fitted_on",
    "describe_model",
    "encoder_record",
    "fingerprint_hint",
    "identity_differences",
    "weights_fingerprint",
]

# -- the encoder ------------------------------------------------------------------------------------------------

#: Prefix of fingerprints of the current scheme (:func:`weights_fingerprint`). Fingerprints written before it
#: (16 hex digits, no prefix) hashed only the config, the vocabulary and the first 256 embedding rows, so they
#: cannot tell two checkpoints with different transformer layers apart; they are refused, not trusted.
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


def weights_fingerprint(model: torch.nn.Module, tokenizer: Any) -> str:
    """``FINGERPRINT_SCHEME`` + 16 hex digits of a sha256 over the architecture, the vocabulary and every parameter.

    Each parameter (by name, shape and value) is hashed after rounding to bfloat16, so the same checkpoint loaded
    in float32, float16 or bfloat16, on any device, gives the same value, while any change of a weight larger
    than bfloat16's resolution (relative 2^-9) changes it; retraining or fine-tuning moves many weights that far.
    Cost: one pass over the weights (a bfloat16 copy of one tensor at a time, then sha256), once per encoder:
    0.5 s for the 22.7M parameters of a 6-layer 384-wide BERT and 1.0 s for the 109.5M of BERT-base on a 2-core
    Xeon shared with other jobs (``benchmarks/fingerprint_cost.py``; on a GPU the rounding runs there and only
    bfloat16 bytes are copied).
    Hashing the parameters rather than the checkpoint files gives the same value whether the model came from a
    local folder, the hub cache, a bundled copy or an object built in memory.
    """
    import torch

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


def fingerprint_hint(saved: object) -> str:
    """An explanation to add to a fingerprint-mismatch error when ``saved`` predates the current scheme, else ``""``."""
    if isinstance(saved, str) and not saved.startswith(FINGERPRINT_SCHEME):
        return (
            f" (the saved fingerprint {saved!r} is of an earlier scheme that hashed only the "
            "config, the vocabulary and the first 256 embedding rows, so it cannot show that the encoder's weights "
            "are the ones the calibrator was fitted on: refit it with this bertflow)"
        )
    return ""


#: What a ``fitted_on`` record keeps of the encoder whose embeddings a calibrator was fitted on (plus ``framework``:
#: ``"bertflow"`` for a :class:`~bertflow.encoding.encoder.SentenceEncoder`, ``"sentence-transformers"`` for a model
#: of that library).
ENCODER_KEYS = ("model", "revision", "pooling", "max_length", "dim", "fingerprint", "tokenizer_fingerprint")
#: Keys that records written by an earlier bertflow lack: such a record is not compared on them (a folder saved
#: before the tokenizer was fingerprinted still loads; its tokenizer cannot be checked).
LATER_ENCODER_KEYS = ("tokenizer_fingerprint",)
#: The fields compared with a calibrator's ``fitted_on`` before it is applied (the dimension is checked apart);
#: each only where both sides record it.
_CHECKED_KEYS = ("fingerprint", "pooling", "max_length", "token_statistics", "tokenizer_fingerprint")


def encoder_record(encoder: Any, *, framework: str = "bertflow") -> dict[str, Any]:
    """The record of an encoder (``fitted_on``) kept by whatever holds a calibrator fitted on its embeddings.

    Args:
        encoder: a :class:`~bertflow.encoding.encoder.SentenceEncoder` (its ``get_config()`` is read), or a mapping
            with at least :data:`ENCODER_KEYS` (the sentence-transformers integration builds one from its model).
        framework: the library that computed the embeddings.

    Returns:
        ``{key: value for key in ENCODER_KEYS}`` plus ``framework``: the same keys whichever route fitted the
        calibrator (``Embedder.fit``, ``bertflow distributed-fit``, ``fit_calibrator``).

    Raises:
        ValueError: a mapping without one of :data:`ENCODER_KEYS` (a programming error, not a user's).
    """
    config = encoder if isinstance(encoder, Mapping) else encoder.get_config()
    missing = [key for key in ENCODER_KEYS if key not in config]
    if missing:
        raise ValueError(f"an encoder record needs {', '.join(missing)}")
    from .encoding.loading import portable_model_name  # here: the encoding package imports this module

    # A weighted pooling's vectors also depend on the token statistics its weights come from (their digest).
    extra = {"token_statistics": config["token_statistics"]} if config.get("token_statistics") else {}
    record = {**{key: config[key] for key in ENCODER_KEYS}, **extra, "framework": framework}
    # The record is saved and published with the calibrator: a local folder's name, never its absolute path.
    record["model"] = portable_model_name(str(record["model"]))
    return record


def check_fitted_on(
    calibrator: Calibrator,
    ours: Mapping[str, Any],
    fitted_on: Mapping[str, Any] | None = None,
    *,
    subject: str = "this encoder",
    advice: Callable[[str, Any], str] | None = None,
) -> None:
    """Refuse to apply ``calibrator`` to embeddings of an encoder other than the one it was fitted on.

    Args:
        calibrator: a fitted calibrator; its input dimension is compared.
        ours: the record of the encoder at hand (its ``get_config()``, or the integration's equivalent); a value it
            gives as ``None`` (not computable there) is not compared.
        fitted_on: the :func:`encoder_record` of the encoder it was fitted on, where its holder kept one; ``None``
            (unknown) compares the dimension only.
        subject: how the messages name the encoder at hand.
        advice: ``(key, recorded value) -> what to do``; default: refit, or load the matching encoder.

    Raises:
        CompatibilityError: another dimension, weight fingerprint, pooling or truncation length.
    """
    check_dimension(calibrator, ours.get("dim"), ours.get("model"))
    if not fitted_on:
        if calibrator.name != "identity":  # nothing fitted that another encoder could make wrong
            # Fitted with plain .fit(X): only the dimension can be checked. Python shows this once per place.
            warnings.warn(
                f"the {calibrator.name} calibrator records no encoder (fitted with plain .fit(X)), so only its "
                f"dimension can be checked against {subject}; make sure X came from this encoder, pooling and "
                "max_length, or fit through Embedder.fit / fit_embeddings, which record it",
                UserWarning,
                stacklevel=3,
            )
        return
    for key in _CHECKED_KEYS:
        if key in fitted_on and ours.get(key) is not None and fitted_on[key] != ours[key]:
            todo = advice(key, fitted_on[key]) if advice else "refit it or load the matching encoder"
            raise CompatibilityError(
                f"the calibrator was fitted with {key}={fitted_on[key]!r} (encoder {fitted_on.get('model')}), but "
                f"{subject} has {key}={ours[key]!r}; {todo}"
                + (fingerprint_hint(fitted_on[key]) if key == "fingerprint" else "")
                + (
                    " (the tokenizer gives other token ids than at the fit: its tokenizer.json or "
                    "tokenizer_config.json changed, e.g. lowercasing, special tokens or truncation side)"
                    if key == "tokenizer_fingerprint"
                    else ""
                )
            )


def check_dimension(calibrator: Calibrator, dim: int | None, model: object = None) -> None:
    """Refuse a fitted ``calibrator`` whose input width is not ``dim``, the width of the encoder ``model``'s
    embeddings (``None``: not known, not checked).

    Raises:
        CompatibilityError: naming both widths.
    """
    if dim is not None and int(calibrator.n_features_in_) != int(dim):
        raise CompatibilityError(
            f"the calibrator was fitted on {calibrator.n_features_in_}-dimensional embeddings, but "
            f"{model} gives {dim}; refit it for this encoder"
        )


def identity_differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """What differs between two model identities (``Embedder.identity()``: an encoder config and a
    :func:`calibrator_identity`), e.g. ``["encoder fingerprint", "calibrator type"]``; empty for the same model."""
    differences = []
    for part, keys in (
        ("encoder", ("fingerprint", "pooling", "max_length", "dim", "token_statistics", *LATER_ENCODER_KEYS)),
        ("calibrator", ("type", "fingerprint")),
    ):
        for key in keys:
            old, new = (recorded.get(part) or {}).get(key), (current.get(part) or {}).get(key)
            if key in LATER_ENCODER_KEYS and (old is None or new is None):
                continue  # recorded before bertflow kept it: nothing to compare
            if old != new:
                differences.append(f"{part} {key}")
    return differences


def describe_model(identity: Mapping[str, Any] | None) -> str:
    """One line naming an encoder + calibrator identity (as in :meth:`bertflow.Embedder.identity`)."""
    if not identity:
        return "an unknown model"
    enc, cal = identity.get("encoder", {}), identity.get("calibrator", {})
    return (
        f"encoder {enc.get('model')} (pooling {enc.get('pooling')}, max_length {enc.get('max_length')}, "
        f"fingerprint {enc.get('fingerprint')}) + {cal.get('type')} calibrator (fingerprint {cal.get('fingerprint')})"
    )
