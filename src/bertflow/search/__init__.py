"""Semantic search: :mod:`.ann` the top-k (exact or approximate), :mod:`.index` :class:`~.index.EmbeddingIndex`
(``bertflow.EmbeddingIndex``) and its folder, :mod:`.sentences` building and querying one with an Embedder."""
