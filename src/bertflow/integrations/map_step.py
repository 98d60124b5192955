"""A map step for data-parallel engines (Ray Data, Spark, a ``multiprocessing.Pool``): batches of text in, the same
batches with an embedding column out (:class:`MapEncoder`).

Each worker builds one :class:`MapEncoder` (loading the model once, at its first batch) and calls it on every batch.
It pickles without the loaded model, so it can be shipped to workers as an object (Spark's
``df.mapInArrow(enc.map_batches, ...)``) or built there from keyword arguments (Ray's ``fn_constructor_kwargs``).
Ray and Spark are not dependencies of bertflow; pyarrow is needed for Arrow batches only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ..errors import InputError


class MapEncoder:
    """Embed the text column of each batch with one loaded model: ``model_dir``, a folder written by ``bertflow fit``
    / :meth:`Embedder.save` or its hub id, gives calibrated embeddings (:meth:`Embedder.encode`); ``model`` instead,
    a raw encoder (hub id or local folder) with ``pooling`` and ``max_length``, uncalibrated ones
    (:meth:`SentenceEncoder.encode`). ``text_column`` holds the sentences (strings, none blank or null);
    ``output_column`` is added, float32 [D] per row; ``device``, ``dtype``: where and in which precision the worker
    encodes (``None``: CUDA if available, else CPU); ``batch_size``: sentences per forward pass (``None``: the
    encoder's token budget); ``fixed_size``: Arrow output as ``fixed_size_list<float32>[D]`` (the default) or a
    variable ``list<float32>`` (Spark's Arrow conversion reads only the latter).

    Calling it on a batch returns the batch with ``output_column`` added, in the batch's own form:
    ``pyarrow.Table`` or ``pyarrow.RecordBatch`` (a new column) or a ``dict`` of columns (Ray's ``"numpy"`` format:
    a float32 array [n, D]). Rows keep their order.
    """

    def __init__(
        self,
        model_dir: str | None = None,
        *,
        model: str | None = None,
        pooling: str = "mean",
        max_length: int = 64,
        text_column: str = "text",
        output_column: str = "embedding",
        device: str | None = None,
        dtype: str = "auto",
        batch_size: int | None = None,
        fixed_size: bool = True,
    ) -> None:
        if (model_dir is None) == (model is None):
            raise InputError("give model_dir (a fitted bertflow model) or model (a raw encoder), exactly one")
        self.settings = {
            "model_dir": model_dir,
            "model": model,
            "pooling": pooling,
            "max_length": int(max_length),
            "device": device,
            "dtype": dtype,
        }
        self.text_column, self.output_column = text_column, output_column
        self.batch_size, self.fixed_size = batch_size, bool(fixed_size)
        self._encode: Any = None  # the loaded model's encode function, made on first use in each worker

    def __getstate__(self) -> dict[str, Any]:
        # Shipped without the model: each worker loads its own (on its own device) on its first batch.
        return {**self.__dict__, "_encode": None}

    def _encoder(self) -> Any:
        if self._encode is None:
            s = self.settings
            if s["model_dir"] is not None:
                from ..embedder import Embedder

                self._encode = Embedder.load(s["model_dir"], device=s["device"], dtype=s["dtype"]).encode
            else:
                from ..encoding.encoder import SentenceEncoder

                encoder = SentenceEncoder(
                    s["model"], pooling=s["pooling"], max_length=s["max_length"], device=s["device"], dtype=s["dtype"]
                )
                self._encode = encoder.encode
        return self._encode

    def encode(self, sentences: list[str]) -> np.ndarray:
        """Embeddings of ``sentences``: float32 [n, D] ([0, D] for none)."""
        return np.asarray(self._encoder()(sentences, batch_size=self.batch_size, show_progress_bar=False))

    def __call__(self, batch: Any) -> Any:
        """``batch`` with the embedding column added."""
        if isinstance(batch, dict):
            if self.text_column not in batch:
                raise InputError(f"the batch has no column {self.text_column!r}; its columns: {', '.join(batch)}")
            # numpy's str_ items become plain str; anything else is left for the encoder's checks to name.
            texts = [str(t) if isinstance(t, str) else t for t in np.asarray(batch[self.text_column], dtype=object)]
            return {**batch, self.output_column: self.encode(texts)}
        import pyarrow as pa

        if not isinstance(batch, (pa.Table, pa.RecordBatch)):
            raise InputError(
                f"a batch is a pyarrow Table or RecordBatch or a dict of columns, not {type(batch).__name__}"
            )
        if self.text_column not in batch.schema.names:
            raise InputError(
                f"the batch has no column {self.text_column!r}; its columns: {', '.join(batch.schema.names)}"
            )
        vectors = self.encode(batch.column(self.text_column).to_pylist())
        n, dim = vectors.shape
        flat = pa.array(vectors.reshape(-1), type=pa.float32())
        if self.fixed_size:
            column = pa.FixedSizeListArray.from_arrays(flat, dim)
        else:
            column = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * dim), flat)
        return batch.append_column(self.output_column, column)

    def map_batches(self, batches: Iterable[Any]) -> Iterator[Any]:
        """``self(b)`` for every batch: the function Spark's ``mapInArrow`` calls (an iterator of record batches)."""
        for batch in batches:
            yield self(batch)
