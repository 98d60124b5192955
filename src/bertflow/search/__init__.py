"""Semantic search over calibrated embeddings, in three modules:

- :mod:`.ann`: top-k over stored rows, exact (torch blockwise, faiss flat) or approximate (faiss HNSW / IVF, with
  ``"auto"`` choosing by measured recall);
- :mod:`.index`: :class:`~bertflow.search.index.EmbeddingIndex` (``bertflow.EmbeddingIndex``), the rows with their
  ids, texts and model identity, and its folder (save / load, checksums, model check);
- :mod:`.sentences`: building, extending and querying an index with an Embedder (``index_sentences``,
  ``index_file``, ``add_sentences``, ``query``).
"""
