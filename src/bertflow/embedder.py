"""Embedder: a frozen encoder joined with a fitted calibrator; fit, encode, compare, save and load.

:meth:`Embedder.save` and :meth:`Embedder.load` write and read the folder of :mod:`bertflow.model_folder`;
:meth:`Embedder.encode` and :meth:`Embedder.similarity` take sentence-transformers' keywords and inputs
(:mod:`bertflow.encode_outputs`), so code written for a ``SentenceTransformer`` runs unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch

from .autofit import auto_inputs, fit_auto
from .calibrators import Calibrator, FlowCalibrator, IdentityCalibrator
from .calibrators.auto import AutoCalibrator, no_harm_warning
from .calibrators.base import calibrator_fingerprint, calibrator_identity
from .card import model_card
from .encode_outputs import (
    EvaluationRecord,
    are_embeddings,
    check_encode_keywords,
    check_truncate_dim,
    convert_embeddings,
    embedding_cosine,
)
from .encoding.encoder import SentenceEncoder
from .encoding.multiprocess import encode_multi_device
from .encoding.token_stats import TokenStatistics
from .errors import InputError
from .model_folder import (
    check_dimension,
    check_fitted_on,
    corpus_digest,
    encoder_record,
    fit_record,
    load_encoder,
    load_model_folder,
    save_model_folder,
)
from .validation import validate_sentences

logger = logging.getLogger(__name__)

#: Where :meth:`Embedder.fit` counts the tokens of a weighted pooling: the fitting sentences, a token corpus, or both.
TokenSource = Literal["fit", "corpus", "both"]


def device_transform(
    encoder: SentenceEncoder, calibrator: Calibrator | None
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``calibrator`` (``None``: none) as a float32 function on ``encoder``'s device, applied to pooled vectors
    before they leave it; CUDA graphs on CUDA (:func:`~bertflow.calibrators.device.fast_torch_transform`)."""
    from .calibrators.device import fast_torch_transform

    return None if calibrator is None else fast_torch_transform(calibrator, encoder.device)


def iter_calibrated(
    encoder: SentenceEncoder,
    calibrator: Calibrator | None,
    sentences: Iterable[str],
    *,
    batch_size: int | None = None,
    chunk_size: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> Iterator[np.ndarray]:
    """bertflow's one encode-then-calibrate stream: float32 [n, D'] chunks of ``sentences`` (any iterable of
    non-blank strings) in input order, calibrated on the device (``None``: raw pooled vectors); keywords as
    :meth:`SentenceEncoder.iter_encode`."""
    yield from encoder.iter_encode(
        sentences,
        batch_size=batch_size,
        chunk_size=chunk_size,
        transform=device_transform(encoder, calibrator),
        progress=progress,
    )


def _token_source(
    encoder: SentenceEncoder, token_corpus: Iterable[str] | None, token_source: TokenSource | None
) -> TokenSource | None:
    """Where ``Embedder.fit`` counts tokens (``None``: the pooling is not weighted), checked before any work."""
    if token_source is not None and token_source not in get_args(TokenSource):
        raise InputError(f"token_source must be one of {', '.join(get_args(TokenSource))}, got {token_source!r}")
    if not encoder.pooling.weighting.weighted:
        if token_corpus is not None or token_source is not None:
            raise InputError(
                f"token statistics weight a frequency-weighted pooling, and {encoder.pooling.name!r} is not one: "
                f"use e.g. pooling 'sif:{encoder.pooling.to_spec()}' (--weighting sif)"
            )
        return None
    source = token_source or ("corpus" if token_corpus is not None else "fit")
    if source != "fit" and token_corpus is None:
        raise InputError(f"token_source {source!r} needs a token corpus (--token-stats FILE)")
    if source == "fit" and token_corpus is not None:
        raise InputError("a token corpus was given but token_source is 'fit': use 'corpus' or 'both'")
    if isinstance(token_corpus, str):
        raise InputError("token_corpus must be a list of sentences, not one string")
    return source


class Embedder:
    """Sentence encoder + calibrator, with SimCSE's small surface: ``fit``, ``encode``, ``similarity``.

    ``encoder``: the frozen encoder; ``None`` builds the default (all-MiniLM-L6-v2, mean pooling); a path or hub id
    loads that saved model (as ``SentenceTransformer("name")``). ``calibrator``: ``None`` uses BERT-flow.
    ``truncate_dim``: keep the first calibrated dimensions in :meth:`encode`. ``fitted_on``: for a calibrator fitted
    elsewhere, the :func:`~bertflow.model_folder.encoder_record` of its encoder, checked now and on load (``None``:
    only the dimension). :attr:`encoder_dir`: a bundled encoder's files; :attr:`source`: the folder or hub id last
    loaded or saved; :attr:`model_card_data`: where sentence-transformers' evaluators record metrics.
    """

    def __init__(
        self,
        encoder: SentenceEncoder | str | Path | None = None,
        calibrator: Calibrator | None = None,
        *,
        truncate_dim: int | None = None,
        fitted_on: dict[str, Any] | None = None,
    ) -> None:
        self.truncate_dim = truncate_dim
        self.model_card_data = EvaluationRecord()
        if isinstance(encoder, (str, Path)):
            if calibrator is not None:
                raise InputError(
                    f"Embedder({str(encoder)!r}, calibrator) is ambiguous: a path loads a saved model with its own "
                    "calibrator; for a new model pass SentenceEncoder(path) and the calibrator"
                )
            loaded = vars(type(self).load(encoder))
            self.__dict__.update({**loaded, "truncate_dim": truncate_dim, "model_card_data": self.model_card_data})
            return
        if encoder is not None and not isinstance(encoder, SentenceEncoder):
            raise InputError(
                f"Embedder(encoder) takes a SentenceEncoder, a saved model's path or None, not {type(encoder).__name__}"
            )
        self.encoder = encoder if encoder is not None else SentenceEncoder()
        self.calibrator = calibrator if calibrator is not None else FlowCalibrator()
        self.fit_info: dict[str, Any] = {}
        self.fitted_on: dict[str, Any] | None = fitted_on
        # calibrator_fingerprint of the calibrator that fit_info and fitted_on describe: a calibrator refitted
        # behind the Embedder's back no longer matches, and they are dropped.
        self._recorded_for: str | None = None
        self.source: str | None = None
        self.encoder_dir: Path | None = None
        if isinstance(self.calibrator, IdentityCalibrator) and not self.calibrator.is_fitted:
            self.calibrator.fit(np.zeros((1, self.encoder.dim)))  # needs no data: fitted now, never by a check
        if self.calibrator.is_fitted:
            check_fitted_on(self.calibrator, self.encoder.get_config(), fitted_on)
            if fitted_on is not None:
                self._recorded_for = calibrator_fingerprint(self.calibrator)

    def fit(
        self,
        sentences: Sequence[str],
        *,
        batch_size: int | None = None,
        show_progress_bar: bool | None = None,
        regime: str = "custom",
        token_corpus: Iterable[str] | None = None,
        token_source: TokenSource | None = None,
    ) -> Embedder:
        """Encode ``sentences`` (no labels; duplicates weight the density) and fit the calibrator on them; returns
        ``self``. ``regime``: a free-form label for the model card (``"target"``, ``"nli"`` ...). A weighted pooling
        (``sif:mean`` ...) first counts token statistics on ``token_source``: ``"fit"`` (the sentences, tokenised
        once), ``"corpus"`` (``token_corpus``) or ``"both"``; ``None``: ``"corpus"`` if ``token_corpus`` is given."""
        items = validate_sentences(sentences)
        source = _token_source(self.encoder, token_corpus, token_source)
        started = time.perf_counter()
        to_encode: Any = items
        if source is not None:
            parts = []
            if source in ("fit", "both"):
                to_encode = self.encoder.tokenize_arrays(items)
                parts.append(self.encoder.count_tokens(to_encode))
            if source in ("corpus", "both"):
                parts.append(self.encoder.count_tokens(token_corpus))
            self.encoder.token_statistics = TokenStatistics.total(parts)
        auto: dict[str, Any] | None = None
        if isinstance(self.calibrator, AutoCalibrator):
            X, auto = self._fit_auto(to_encode, weigh=source is None, batch_size=batch_size, show=show_progress_bar)
        else:
            X = self.encoder.encode(to_encode, batch_size=batch_size, show_progress_bar=show_progress_bar)
            self.calibrator.fit(X)
        if message := no_harm_warning(self.calibrator, *X.shape):
            logger.warning("%s", message)
        record = fit_record(
            len(items),
            corpus_sha256=corpus_digest(items),
            regime=regime,
            seconds=time.perf_counter() - started,
            device=self.encoder.device,
        )
        return self.record_fit({**record, **({"auto": auto} if auto else {})})

    def _fit_auto(
        self, items: Any, *, weigh: bool, batch_size: int | None, show: bool | None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Fit the :class:`AutoCalibrator` (:func:`bertflow.autofit.fit_auto`) in ONE forward pass; a raw encoder
        keeps the weighted pooling and the prior's statistics. Returns the embeddings fitted on and the choice."""
        enc = self.encoder
        inputs = auto_inputs(enc, weigh=weigh)
        if inputs.prior is not None:
            enc.token_statistics = inputs.prior.statistics
        out = enc.encode(items, batch_size=batch_size, show_progress_bar=show, poolings=inputs.poolings())
        fit = fit_auto(self.calibrator, inputs, lambda pooling: out[pooling.key])
        if fit.prior is not None:
            enc.set_pooling(fit.pooling)
        elif inputs.prior is not None:
            enc.token_statistics = None
        return fit.embeddings, fit.choice

    def fit_embeddings(self, X: np.ndarray) -> Embedder:
        """Fit the calibrator on embeddings [N, D] already produced by this encoder (e.g. from a cache)."""
        self.calibrator.fit(X)
        return self.record_fit({})

    def record_fit(self, fit_info: dict[str, Any]) -> Embedder:
        """Declare that the calibrator has just been fitted on this encoder's embeddings (as :meth:`fit` and
        ``bertflow distributed-fit`` do): sets :attr:`fit_info` (a :func:`~bertflow.model_folder.fit_record`) and
        :attr:`fitted_on`. Returns ``self``."""
        self.check_fitted()
        self.fit_info = dict(fit_info)
        self.fitted_on = encoder_record(self.encoder)
        self._recorded_for = calibrator_fingerprint(self.calibrator)
        return self

    def fit_records(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """``(fit_info, fitted_on)`` if they still describe the calibrator held, else ``({}, None)``: what
        :meth:`save` writes."""
        if self._recorded_for is not None and self._recorded_for == calibrator_fingerprint(self.calibrator):
            return self.fit_info, self.fitted_on
        if self.fitted_on is not None or self.fit_info:
            logger.warning("the calibrator was refitted outside this Embedder: its fitting record is not saved")
        return {}, None

    def encode(
        self,
        sentences: str | Sequence[str],
        *,
        batch_size: int | None = None,
        show_progress_bar: bool | None = None,
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
        normalize_embeddings: bool = False,
        precision: str | None = "float32",
        device: str | torch.device | list[str | torch.device] | None = None,
        truncate_dim: int | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
        output_value: str | None = "sentence_embedding",
        **unknown: Any,
    ) -> Any:
        """Calibrated embeddings: float32 [N, D'] (or [D'] for one string), calibrated on the encoder's device.

        The keywords are sentence-transformers' ``encode`` keywords, with its meaning (an unknown one is a TypeError
        naming all); ``precision`` quantises with its ``quantize_embeddings``. ``device``: ``None``, the encoder's
        own, or a list of devices, one process each (:func:`~bertflow.encoding.multiprocess.encode_multi_device`).
        InputError for a prompt (the calibrator was fitted without one), another device, or an ``output_value``
        other than ``"sentence_embedding"``.
        """
        precision = "float32" if precision is None else precision  # sentence-transformers' evaluators pass None
        check_encode_keywords(
            unknown,
            prompt=prompt,
            prompt_name=prompt_name,
            device=device,
            encoder_device=self.encoder.device,
            precision=precision,
            output_value=output_value,
        )
        truncate_dim = self.truncate_dim if truncate_dim is None else truncate_dim
        dim = self.calibrator_dim()
        check_truncate_dim(truncate_dim, dim)
        single = isinstance(sentences, str)
        if isinstance(device, (list, tuple)):
            items = [sentences] if single else list(sentences)
            devices = [str(d) for d in device]
            raw = encode_multi_device(items, self.encoder, devices, dtype=self.encoder.dtype, batch_size=batch_size)
            out = np.asarray(self.calibrator.transform(raw), dtype=np.float32)
            out = out[0] if single else out
        else:
            out = self.encoder.encode(
                sentences,
                batch_size=batch_size,
                show_progress_bar=show_progress_bar,
                transform=device_transform(self.encoder, self.calibrator),
                transform_dim=dim,
            )
        return convert_embeddings(
            out,
            single=single,
            device=self.encoder.device,
            truncate_dim=truncate_dim,
            normalize_embeddings=normalize_embeddings,
            precision=precision,
            convert_to_tensor=convert_to_tensor,
            convert_to_numpy=convert_to_numpy,
        )

    #: sentence-transformers' ``encode_query`` and ``encode_document``: :meth:`encode` (the space is symmetric).
    encode_query = encode_document = encode

    @property
    def similarity_fn_name(self) -> str:
        """``"cosine"``, what :meth:`similarity` computes (sentence-transformers' attribute); setting another is an
        InputError."""
        return "cosine"

    @similarity_fn_name.setter
    def similarity_fn_name(self, value: str) -> None:
        if str(getattr(value, "value", value)) != "cosine":
            raise InputError(f"an Embedder compares by cosine only, not {value!r}")

    @property
    def device(self) -> torch.device:
        """The encoder's device (sentence-transformers' ``model.device``)."""
        return self.encoder.device

    def get_embedding_dimension(self) -> int:
        """Dimension of :meth:`encode`'s vectors: :attr:`truncate_dim` if set, else the calibrated dimension D'."""
        return self.calibrator_dim() if self.truncate_dim is None else int(self.truncate_dim)

    get_sentence_embedding_dimension = get_embedding_dimension  # sentence-transformers' older name

    def similarity(
        self, a: str | Sequence[str] | np.ndarray | torch.Tensor, b: str | Sequence[str] | np.ndarray | torch.Tensor
    ) -> torch.Tensor:
        """Cosine similarity in the calibrated space, as ``SentenceTransformer.similarity``: a float32 CPU tensor
        [len(a), len(b)] (computed in float64) of sentences (a string is one row) or of two embedding inputs
        ([N, D'] or [D'])."""
        if not are_embeddings(a, b):
            a, b = self.encode(a), self.encode(b)
        return embedding_cosine(a, b, pairwise=False)

    def similarity_pairwise(
        self,
        a: Sequence[str] | np.ndarray | torch.Tensor,
        b: Sequence[str] | np.ndarray | torch.Tensor,
        *,
        show_progress_bar: bool | None = None,
    ) -> torch.Tensor:
        """Cosine of each pair ``(a[i], b[i])`` of sentences or of embedding rows, as
        ``SentenceTransformer.similarity_pairwise``: a float32 CPU tensor [N]."""
        if not are_embeddings(a, b):
            if len(a) != len(b):
                raise ValueError(f"need as many first as second sentences, got {len(a)} and {len(b)}")
            self.check_fitted()
            from tqdm.auto import tqdm

            transform, dim = device_transform(self.encoder, self.calibrator), self.calibrator_dim()
            show = 2 * len(a) >= 4096 if show_progress_bar is None else show_progress_bar
            with tqdm(total=2 * len(a), desc="similarity", unit="sent", disable=not show) as bar:
                a, b = (
                    self.encoder.encode(
                        list(side),
                        show_progress_bar=False,
                        transform=transform,
                        transform_dim=dim,
                        progress=bar.update,
                    )
                    for side in (a, b)
                )
        return embedding_cosine(a, b, pairwise=True)

    def check_fitted(self) -> None:
        """NotFittedError unless the calibrator is fitted; CompatibilityError when it was fitted, after this
        Embedder was made, on embeddings of another width than the encoder's."""
        self.calibrator.check_fitted()
        check_dimension(self.calibrator, self.encoder.dim, self.encoder.model_id)

    def identity(self) -> dict[str, Any]:
        """What makes this model's vectors what they are (encoder config, calibrator identity): saved with an
        index and compared when it is used."""
        self.check_fitted()
        return {"encoder": self.encoder.get_config(), "calibrator": calibrator_identity(self.calibrator)}

    def iter_encode(
        self, sentences: Sequence[str], *, batch_size: int | None = None, show_progress_bar: bool | None = None
    ) -> Iterator[np.ndarray]:
        """Calibrated embeddings of ``sentences`` in chunks (float32 [<=16384, D']), in order, with a progress bar:
        memory stays bounded by one chunk."""
        from tqdm.auto import tqdm

        self.check_fitted()
        show = len(sentences) >= 4096 if show_progress_bar is None else show_progress_bar
        with tqdm(total=len(sentences), desc="encode", unit="sent", disable=not show) as bar:
            yield from iter_calibrated(
                self.encoder, self.calibrator, sentences, batch_size=batch_size, progress=bar.update
            )

    def calibrator_dim(self) -> int:
        """Dimension D' of the calibrated vectors."""
        self.check_fitted()
        return int(self.calibrator.n_features_out_)

    def save(self, path: str | Path, *, include_encoder: bool = False, overwrite: bool = False) -> Path:
        """Write the folder of :mod:`bertflow.model_folder` at ``path``, atomically; returns its path.

        ``path``: new, empty, or (with ``overwrite``) a bertflow model, replaced whole; anything else is an
        OutputError (:func:`~bertflow.io.files.check_output_folder`). ``include_encoder`` also copies the encoder's
        Hugging Face files into ``encoder/``, so the folder is self-contained.
        """
        self.check_fitted()
        save_model_folder(path, self, model_card, include_encoder=include_encoder, overwrite=overwrite)
        self.source = str(Path(path).expanduser().resolve())
        logger.info("saved %r to %s", self, path)
        return Path(path)

    @classmethod
    def load(
        cls, path: str | Path, *, device: str | None = None, dtype: str = "auto", revision: str | None = None
    ) -> Embedder:
        """Load a folder written by :meth:`save`, or a Hugging Face Hub repo id holding one (at ``revision``);
        ``device``, ``dtype`` as :class:`~bertflow.encoding.encoder.SentenceEncoder`. ModelFileError for missing,
        corrupted or edited files, a newer format, or a path that is neither a folder nor a fetchable hub repo;
        CompatibilityError for a calibrator that does not match the encoder.
        """

        def assemble(folder: Path, config: dict[str, Any], calibrator: Calibrator, source: str) -> Embedder:
            encoder, encoder_dir = load_encoder(folder, config, device=device, dtype=dtype)
            embedder = cls(encoder, calibrator, fitted_on=config["calibrator"].get("fitted_on"))
            embedder.fit_info = config.get("fitting", {})
            embedder._recorded_for = calibrator_fingerprint(calibrator)
            embedder.source = source
            embedder.encoder_dir = encoder_dir
            return embedder

        return load_model_folder(path, assemble, revision=revision)

    def close(self) -> None:
        """Stop the encoder's tokenisation worker processes, if any (see :meth:`SentenceEncoder.close`)."""
        self.encoder.close()

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Embedder({self.encoder!r}, {self.calibrator!r})"
