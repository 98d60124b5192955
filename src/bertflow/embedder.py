"""Embedder: a frozen encoder joined with a fitted calibrator; fit, encode, compare, save and load.

:meth:`Embedder.save` writes, and :meth:`Embedder.load` reads back (from a folder or its hub id), the folder that
:mod:`bertflow.model_folder` describes and verifies. :meth:`Embedder.encode` and :meth:`Embedder.similarity` take
sentence-transformers' keywords and embedding inputs (:mod:`bertflow.encode_outputs`), so code written for a
``SentenceTransformer`` runs unchanged.

Everything else takes an Embedder: search (:mod:`bertflow.search.sentences`), hub upload
(:func:`bertflow.hub.push`), the model card (:func:`bertflow.card.model_card`), the sentence-transformers export
(:func:`bertflow.integrations.st_export.from_embedder`) and MTEB
(:class:`bertflow.integrations.mteb.MTEBEncoder`).
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
    """``calibrator`` as a float32 function on ``encoder``'s device (:meth:`Calibrator.torch_transform`), for the
    encoder to apply to pooled vectors before they leave the device; ``None`` for no calibrator. On CUDA it is
    replayed from CUDA graphs (:func:`~bertflow.calibrators.device.fast_torch_transform`, bit-identical): one
    launch per chunk instead of hundreds of small ones for a flow."""
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
    """The encode-then-calibrate loop: float32 [n, D'] chunks of calibrated embeddings of ``sentences`` (any iterable
    of non-blank strings: a list, a file reader), in input order; ``calibrator`` ``None`` gives the raw pooled
    vectors; the keywords are :meth:`SentenceEncoder.iter_encode`'s.

    Every calibrated stream in bertflow goes through here (:meth:`Embedder.iter_encode`, ``bertflow encode``, the
    scale-out store writer): the encoder's one forward pass (:meth:`SentenceEncoder.iter_encode`), the calibrator
    applied on the device in float32 before the copy to the host, and the NaN/Inf and overflow checks done once,
    there (naming the stream row). :meth:`Embedder.encode` is the same path for a list held in memory.
    """
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


def warn_if_harmful(calibrator: Calibrator, shape: tuple[int, ...]) -> None:
    """Log the label-free no-harm warning (:func:`~bertflow.calibrators.auto.no_harm_warning`) of a fit on
    ``shape`` = (N sentences, D dimensions), if there is one."""
    message = no_harm_warning(calibrator, int(shape[0]), int(shape[1]))
    if message:
        logger.warning("%s", message)


class Embedder:
    """Sentence encoder + calibrator, with SimCSE's small surface: ``fit``, ``encode``, ``similarity``.

    ``encoder``: the frozen encoder; ``None`` builds the embedded default (all-MiniLM-L6-v2, mean pooling); a path or
    hub id (``Embedder("my-flow")``, as ``SentenceTransformer("name")``) loads that saved model with :meth:`load`, or
    raises its error at once. ``calibrator``: unfitted or fitted; ``None`` uses BERT-flow (:class:`FlowCalibrator`).
    ``truncate_dim``: keep the first ``truncate_dim`` calibrated dimensions in :meth:`encode` (sentence-transformers'
    ``truncate_dim``; ``None`` keeps all; may be changed later). ``fitted_on``: for a calibrator fitted elsewhere,
    the :func:`~bertflow.model_folder.encoder_record` of the encoder it was fitted on (as a saved folder keeps it),
    checked against ``encoder`` now; saved with the model and checked when it is loaded; ``None`` when unknown (then
    only the dimension is checked). ``fit_info``: how the calibrator was fitted
    (:func:`~bertflow.model_folder.fit_record`), saved with the model, empty when unknown. ``encoder_dir``: the local
    folder of the encoder's Hugging Face files when loaded from a self-contained save (copied again by :meth:`save`).
    ``source``: the folder or hub id this model was loaded from or last saved to. ``model_card_data``: where
    sentence-transformers' evaluators record their metrics (:class:`EvaluationRecord`). In short:
    ``Embedder().fit(sentences).save("my-flow")``, then ``Embedder.load("my-flow").encode("hello")`` ([384] floats).
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
            # sentence-transformers' SentenceTransformer("name") idiom: a saved model, loaded now (or refused now),
            # never an object that fails at its first encode.
            if calibrator is not None:
                raise InputError(
                    f"Embedder({str(encoder)!r}, calibrator) is ambiguous: a path loads a saved model with its own "
                    "calibrator; for a new model pass SentenceEncoder(path) and the calibrator"
                )
            loaded = type(self).load(encoder)
            state = {**vars(loaded), "truncate_dim": truncate_dim, "model_card_data": self.model_card_data}
            self.__dict__.update(state)
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
        # behind the Embedder's back (calibrator.fit(X) on other embeddings) no longer matches, and they are dropped.
        self._recorded_for: str | None = None
        self.source: str | None = None
        self.encoder_dir: Path | None = None
        if isinstance(self.calibrator, IdentityCalibrator) and not self.calibrator.is_fitted:
            self.calibrator.fit(np.zeros((1, self.encoder.dim)))  # needs no data: fitted now, never by a check
        if self.calibrator.is_fitted:
            # Without a record (a calibrator fitted with plain .fit(X)) only the dimension can be checked: a warning.
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
        """Encode ``sentences`` (no labels; duplicates kept, they weight the density) and fit the calibrator on
        them; returns ``self``. ``regime`` is a free-form label saved in the model card (``"target"``, ``"nli"`` ...).

        With a frequency-weighted pooling (``sif:first-last-avg`` ...) the encoder's token statistics are fitted
        first (:meth:`SentenceEncoder.count_tokens`), from unlabeled text only: in ``token_source`` ``"fit"`` (the
        fitting sentences, then tokenised once, for counting and for encoding), ``"corpus"`` (``token_corpus``) or
        ``"both"``; ``None``: ``"corpus"`` when a ``token_corpus`` is given, else ``"fit"``. InputError for token
        options without a weighted pooling, or a source needing a ``token_corpus`` without one.
        """
        items = validate_sentences(sentences)
        source = _token_source(self.encoder, token_corpus, token_source)
        started = time.perf_counter()
        to_encode: Any = items
        if source is not None:
            parts = []
            if source in ("fit", "both"):
                to_encode = self.encoder.tokenize_arrays(items)  # tokenised once: counted here, encoded below
                parts.append(self.encoder.count_tokens(to_encode))
            if source in ("corpus", "both"):
                assert token_corpus is not None
                parts.append(self.encoder.count_tokens(token_corpus))
            self.encoder.token_statistics = TokenStatistics.total(parts)
        auto: dict[str, Any] | None = None
        if isinstance(self.calibrator, AutoCalibrator):
            X, auto = self._fit_auto(to_encode, weigh=source is None, batch_size=batch_size, show=show_progress_bar)
        else:
            X = self.encoder.encode(to_encode, batch_size=batch_size, show_progress_bar=show_progress_bar)
            self.calibrator.fit(X)
            warn_if_harmful(self.calibrator, X.shape)
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
        """Fit the :class:`AutoCalibrator` as its rule says (:func:`bertflow.autofit.fit_auto`), in ONE forward pass.

        The pass computes the encoder's pooling, the last layer's token mean (whose anisotropy tells a raw MLM
        encoder from a sentence encoder) and, where ``weigh`` and a generic token prior fits the tokenizer, the
        SIF-weighted form of the pooling. On a raw encoder the encoder then keeps the weighted pooling and the
        prior's statistics. Returns the embeddings fitted on and what was chosen (saved in the fit record).
        """
        enc, calibrator = self.encoder, self.calibrator
        inputs = auto_inputs(enc, weigh=weigh)
        if inputs.prior is not None:
            enc.token_statistics = inputs.prior.statistics
        out = enc.encode(items, batch_size=batch_size, show_progress_bar=show, poolings=inputs.poolings())
        fit = fit_auto(calibrator, inputs, lambda pooling: out[pooling.key])
        if fit.prior is not None:
            enc.set_pooling(fit.pooling)
        elif inputs.prior is not None:
            enc.token_statistics = None
        warn_if_harmful(calibrator, fit.embeddings.shape)
        return fit.embeddings, fit.choice

    def fit_embeddings(self, X: np.ndarray) -> Embedder:
        """Fit the calibrator on embeddings [N, D] already produced by this encoder (e.g. from a cache)."""
        self.calibrator.fit(X)
        return self.record_fit({})

    def record_fit(self, fit_info: dict[str, Any]) -> Embedder:
        """Declare that the calibrator has just been fitted on this encoder's embeddings, as ``fit_info`` says
        (:func:`~bertflow.model_folder.fit_record`): sets :attr:`fit_info` and :attr:`fitted_on`. :meth:`fit` calls it;
        so does a fit made elsewhere on this encoder's embeddings (``bertflow distributed-fit``). Returns ``self``.
        """
        self.check_fitted()
        check_dimension(self.calibrator, self.encoder.dim, self.encoder.model_id)
        self.fit_info = dict(fit_info)
        self.fitted_on = encoder_record(self.encoder)
        self._recorded_for = calibrator_fingerprint(self.calibrator)
        return self

    def fit_records(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """``(fit_info, fitted_on)`` if they still describe the calibrator held, else ``({}, None)``: what
        :meth:`save` writes, so a calibrator refitted outside the Embedder is not saved with a record of this one's
        fit."""
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
        """Calibrated embeddings: float32 [N, D'] (or [D'] for one string).

        The calibrator runs on the encoder's device, on each chunk of pooled vectors before they are copied to
        the host (:meth:`Calibrator.torch_transform`, float32), so calibration costs next to nothing on a GPU.

        The other keywords are sentence-transformers' ``encode`` keywords, with its meaning, so code written for a
        ``SentenceTransformer`` runs unchanged (an unknown one is a TypeError naming all): ``convert_to_tensor``
        gives one ``torch.Tensor`` [N, D'] on the encoder's device, ``convert_to_numpy=False`` a list of N tensors
        [D']; ``normalize_embeddings`` scales each vector to unit length; ``precision``: ``"float32"`` (or ``None``),
        or ``"int8"``, ``"uint8"``, ``"binary"``, ``"ubinary"``, quantised with sentence-transformers'
        ``quantize_embeddings`` (ranges from these embeddings); ``device``: ``None`` or the encoder's own device
        (placed once, when built), or a list of devices (``["cuda:0", "cuda:1"]``, ``"cpu"`` may repeat): one spawned
        process per entry encodes a contiguous part (:func:`~bertflow.encoding.multiprocess.encode_multi_device`), and
        the calibrator maps the result here; ``truncate_dim``: keep the first dimensions (before normalising;
        ``None``: :attr:`truncate_dim`). InputError for a prompt (the calibrator was fitted on sentences without
        one), another device, an unknown precision, a ``truncate_dim`` outside [1, D'], or an ``output_value`` other
        than ``"sentence_embedding"`` (token embeddings are not calibrated).
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
        self.check_fitted()
        truncate_dim = self.truncate_dim if truncate_dim is None else truncate_dim
        check_truncate_dim(truncate_dim, self.calibrator_dim())
        if isinstance(device, (list, tuple)):
            out = self._encode_on_devices(sentences, device, batch_size)
        else:
            transform = device_transform(self.encoder, self.calibrator)
            out = self.encoder.encode(
                sentences, batch_size=batch_size, show_progress_bar=show_progress_bar, transform=transform
            )
        return convert_embeddings(
            out,
            single=isinstance(sentences, str),
            device=self.encoder.device,
            truncate_dim=truncate_dim,
            normalize_embeddings=normalize_embeddings,
            precision=precision,
            convert_to_tensor=convert_to_tensor,
            convert_to_numpy=convert_to_numpy,
        )

    def _encode_on_devices(
        self, sentences: str | Sequence[str], devices: Sequence[str | torch.device], batch_size: int | None
    ) -> np.ndarray:
        """Calibrated float32 [N, D'] (or [D'] for one string): one spawned process per entry of ``devices`` gives
        the raw vectors of a contiguous part; the calibrator maps them here."""
        items = [sentences] if isinstance(sentences, str) else list(sentences)
        raw = encode_multi_device(
            items, self.encoder, [str(d) for d in devices], dtype=self.encoder.dtype, batch_size=batch_size
        )
        out = np.asarray(self.calibrator.transform(raw), dtype=np.float32)
        return out[0] if isinstance(sentences, str) else out

    def encode_query(self, sentences: str | Sequence[str], **kwargs: Any) -> Any:
        """sentence-transformers' ``encode_query``: :meth:`encode` (same keywords). The calibrated space is
        symmetric (one encoder, no prompts), so queries and documents are encoded alike."""
        return self.encode(sentences, **kwargs)

    def encode_document(self, sentences: str | Sequence[str], **kwargs: Any) -> Any:
        """sentence-transformers' ``encode_document``: :meth:`encode` (same keywords), as :meth:`encode_query`."""
        return self.encode(sentences, **kwargs)

    @property
    def similarity_fn_name(self) -> str:
        """``"cosine"``: what :meth:`similarity` computes (sentence-transformers' attribute, read by its
        evaluators). Setting it to anything else is an InputError: the calibrated space is built for cosine."""
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

    def get_sentence_embedding_dimension(self) -> int:
        """As :meth:`get_embedding_dimension` (sentence-transformers' older name)."""
        return self.get_embedding_dimension()

    def similarity(
        self, a: str | Sequence[str] | np.ndarray | torch.Tensor, b: str | Sequence[str] | np.ndarray | torch.Tensor
    ) -> torch.Tensor:
        """Cosine similarity in the calibrated space, as ``SentenceTransformer.similarity`` returns it: always a
        float32 CPU ``torch.Tensor`` [len(a), len(b)] (computed in float64); ``float(model.similarity(s1, s2))`` for
        one pair.

        ``a`` and ``b`` are sentences (a string counts as one row) or both embeddings (arrays or tensors [N, D'] or
        [D'], e.g. from :meth:`encode`, as MTEB passes them).
        """
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
        """Cosine of each pair ``(a[i], b[i])`` of sentences, or of rows of two embedding matrices [N, D'], as
        ``SentenceTransformer.similarity_pairwise`` returns it: a float32 CPU ``torch.Tensor`` [N].
        ``show_progress_bar`` as in :meth:`encode`.
        """
        if not are_embeddings(a, b):
            if len(a) != len(b):
                raise ValueError(f"need as many first as second sentences, got {len(a)} and {len(b)}")
            self.check_fitted()
            from tqdm.auto import tqdm

            transform = device_transform(self.encoder, self.calibrator)
            show = 2 * len(a) >= 4096 if show_progress_bar is None else show_progress_bar
            # One bar over both sides, moving per forward batch on CPU (SentenceEncoder.iter_encode's progress).
            with tqdm(total=2 * len(a), desc="similarity", unit="sent", disable=not show) as bar:
                a, b = (
                    self.encoder.encode(list(side), show_progress_bar=False, transform=transform, progress=bar.update)
                    for side in (a, b)
                )
        return embedding_cosine(a, b, pairwise=True)

    def check_fitted(self) -> None:
        """Raise :class:`~bertflow.errors.NotFittedError` unless the calibrator is fitted, and
        :class:`~bertflow.errors.CompatibilityError` when it was fitted, after this Embedder was made, on embeddings
        of another width than the encoder's. Changes nothing."""
        self.calibrator.check_fitted()
        check_dimension(self.calibrator, self.encoder.dim, self.encoder.model_id)

    def identity(self) -> dict[str, Any]:
        """What makes this model's vectors what they are: the encoder config (with its weight fingerprint) and the
        calibrator's type, fingerprint and output dimension. Saved with an index and compared when it is used."""
        self.check_fitted()
        return {"encoder": self.encoder.get_config(), "calibrator": calibrator_identity(self.calibrator)}

    def iter_encode(
        self, sentences: Sequence[str], *, batch_size: int | None = None, show_progress_bar: bool | None = None
    ) -> Iterator[np.ndarray]:
        """Calibrated embeddings of ``sentences`` in chunks (float32 [<=16384, D']), in order, with a progress bar.

        Memory stays bounded by one chunk, so corpora larger than what :meth:`encode` should hold at once stream
        straight into an index.
        """
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
        """Write the folder described in :mod:`bertflow.model_folder` at ``path``, atomically; returns its path.

        ``path``: new, empty, or (with ``overwrite``) a bertflow model, replaced whole (a crash at any point leaves
        the old one in place); an existing model is refused without ``overwrite``, and any other non-empty folder
        (or the working directory) always is (OutputError, :func:`~bertflow.io.files.check_output_folder`).
        ``include_encoder`` also copies the encoder's Hugging Face files into ``encoder/``, so the folder is
        self-contained (a hub repo that needs nothing else); loading then uses that copy.
        """
        self.check_fitted()  # also refuses a calibrator refitted elsewhere on another width
        fit_info, fitted_on = self.fit_records()
        save_model_folder(
            path,
            self.encoder,
            self.calibrator,
            fit_info,
            fitted_on=fitted_on,
            card=lambda: model_card(self, include_encoder=include_encoder),
            include_encoder=include_encoder,
            encoder_dir=self.encoder_dir,
            overwrite=overwrite,
        )
        self.source = str(Path(path).expanduser().resolve())
        logger.info("saved %r to %s", self, path)
        return Path(path)

    @classmethod
    def load(
        cls, path: str | Path, *, device: str | None = None, dtype: str = "auto", revision: str | None = None
    ) -> Embedder:
        """Load a folder written by :meth:`save`, or a Hugging Face Hub repo id holding one (``"user/my-flow"``,
        fetched and cached by huggingface_hub, at ``revision``); ``device``, ``dtype`` as
        :class:`~bertflow.encoding.encoder.SentenceEncoder`. ModelFileError for missing, truncated, corrupted or
        edited files, a format newer than this bertflow reads, or a path that is neither a local folder nor a hub
        repo that can be fetched (offline and not cached); CompatibilityError for a calibrator that does not match
        the encoder.
        """

        def assemble(folder: Path, config: dict[str, Any], calibrator: Calibrator, source: str) -> Embedder:
            encoder, encoder_dir = load_encoder(folder, config, device=device, dtype=dtype)
            fitted_on = config["calibrator"].get("fitted_on")
            # The encoder actually loaded must be the one the calibrator was fitted on (fingerprint, pooling,
            # max_length, dimension), so an edited config or a swapped encoder is refused.
            embedder = cls(encoder, calibrator, fitted_on=fitted_on)
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
