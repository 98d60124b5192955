"""``bertflow search build`` and ``bertflow search query``: semantic search from the command line."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Literal

import typer

from ._app import app
from .options import (
    BatchOpt,
    CorpusArg,
    DeviceOpt,
    DtypeOpt,
    ErrorsOpt,
    OverwriteOpt,
    QuietOpt,
    ThreadsOpt,
    check_text_arguments,
    column_key,
    load_embedder,
    quiet_libraries,
    source_constant,
)

Backend = Literal[source_constant("search/ann", "Backend")]

search_app = typer.Typer(
    help="Semantic search: embed a corpus into an index with a fitted model, then query it.",
    no_args_is_help=True,
)
app.add_typer(search_app, name="search")


@search_app.command(
    epilog="""Examples:

  bertflow search build corpus.txt --model-dir my-flow -o my-index

  bertflow search build docs.tsv -c text --model-dir my-flow -o my-index --unique

  bertflow search build corpus.txt --model-dir user/my-flow -o my-index --backend faiss   (a hub model)

  cut -f2 docs.tsv | bertflow search build - --model-dir my-flow -o my-index      (- reads standard input)

Ids are 1-based line numbers for a text file and 1-based data-row numbers for a TSV.
"""
)
def build(
    corpus: CorpusArg,
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder to write the index to.")],
    model_dir: Annotated[str, typer.Option(help="A folder written by `bertflow fit`, or a hub id holding one.")],
    column: Annotated[
        str | None, typer.Option("--column", "-c", help="For a TSV corpus: the column (name or 0-based index).")
    ] = None,
    unique: Annotated[
        bool, typer.Option(metavar="", help="Index each distinct sentence once (its first occurrence).")
    ] = False,
    backend: Annotated[
        Backend, typer.Option(help="torch (exact, blockwise; no extra dependency) or faiss (exact; needs faiss-cpu).")
    ] = "torch",
    approximate: Annotated[
        Literal[source_constant("search/ann", "Approximate")],
        typer.Option(
            help=f"{', '.join(source_constant('search/ann', 'Approximate'))}. auto: exact below "
            f"{source_constant('search/ann', 'AUTO_APPROXIMATE_MIN_ROWS'):,} rows; from there HNSW only if its "
            f"recall@10, measured on held-out rows of the index, is at least "
            f"{source_constant('search/ann', 'AUTO_MIN_RECALL')}, else exact. hnsw, ivf: approximate (faster on large "
            "corpora, recall below 1; need faiss-cpu). Recorded in the index with the recall measured."
        ),
    ] = "auto",
    encoding_errors: ErrorsOpt = "strict",
    batch_size: BatchOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = "auto",
    overwrite: OverwriteOpt = False,
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Embed a corpus with a fitted model and save it as a searchable index (with the model's identity)."""
    from ..io.files import check_output_folder

    # Before the model loads and the corpus is embedded: the index may not replace the model, the corpus, or a
    # folder of another kind, and an existing index only with --overwrite.
    check_output_folder(output, "index", overwrite=overwrite, inputs=[corpus, model_dir])
    from ..search.ann import VectorSearch
    from ..search.sentences import index_file

    VectorSearch(1, backend=backend, approximate=approximate)  # faiss missing for them: said before the model loads
    quiet_libraries(threads)
    started = time.perf_counter()
    embedder = load_embedder(model_dir, device, dtype)
    index = index_file(
        embedder,
        corpus,
        column=None if column is None else column_key(column),
        unique=unique,
        errors=encoding_errors,
        backend=backend,
        approximate=approximate,
        batch_size=batch_size,
        show_progress_bar=not quiet,
    )
    index.save(output, overwrite=overwrite)
    summary = {
        "output": str(output),
        "rows": len(index),
        "dim": index.dim,
        "search": index.search_kind(),
        # recall@10 of the approximate search on held-out rows of this index (None: exact search)
        "recall": index.recall,
        "model": embedder.source,
        "seconds": round(time.perf_counter() - started, 2),
    }
    typer.echo(json.dumps(summary))


@search_app.command(
    epilog="""Examples:

  bertflow search query my-index "A man is playing a guitar." --top-k 5

  bertflow search query my-index "first query" "second query" --json

  bertflow search query my-index --queries questions.txt --top-k 10 --model-dir my-flow

  cat questions.txt | bertflow search query my-index - --json      (- reads queries from standard input)

Output: per query a "# query" line, then rank, score (cosine), id and text separated by TABs.
--json prints one JSON object per query instead.
"""
)
def query(
    index: Annotated[
        Path, typer.Argument(help="A folder written by `bertflow search build`.", exists=True, file_okay=False)
    ],
    texts: Annotated[
        list[str] | None, typer.Argument(help="Query sentences; - reads one query per line from standard input.")
    ] = None,
    queries: Annotated[
        Path | None,
        typer.Option(help="Text file with one query per line (instead of, or after, the arguments).", dir_okay=False),
    ] = None,
    top_k: Annotated[int, typer.Option("--top-k", "-k", help="Hits per query.")] = 10,
    model_dir: Annotated[
        str | None,
        typer.Option(help="The model to embed queries with; default: the one the index was built with (recorded)."),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", metavar="", help="One JSON object per query.")] = False,
    backend: Annotated[
        Backend | None,
        typer.Option(help=f"Override the index's backend: {' or '.join(source_constant('search/ann', 'Backend'))}."),
    ] = None,
    encoding_errors: ErrorsOpt = "strict",
    device: DeviceOpt = None,
    dtype: DtypeOpt = "auto",
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Find the sentences of an index closest to each query (cosine in the calibrated space)."""
    from ..errors import InputError
    from ..io.files import folder_kind
    from ..io.text import read_sentences
    from ..search.index import EmbeddingIndex
    from ..search.sentences import query as query_index

    given = list(texts or [])
    if given.count("-") > 1:
        raise InputError("- (standard input) may be given once among the queries")
    check_text_arguments([t for t in given if t != "-"], what="query")
    # The kind of folder first: not the index's fault, and it needs no index loaded.
    kind = folder_kind(index)
    if kind is not None and kind != "index":
        raise InputError(
            f"{index} is a bertflow {kind} folder, not a search index; build an index from it first "
            f"(bertflow search build CORPUS --model-dir MODEL -o INDEX)"
        )
    quiet_libraries(threads)
    items: list[str] = []
    for text in given:
        items += read_sentences("-", errors=encoding_errors) if text == "-" else [text]
    if queries is not None:
        items += read_sentences(queries, errors=encoding_errors)
    if not items:
        raise InputError('give query sentences as arguments or --queries FILE, e.g. bertflow search query IDX "text"')
    idx = EmbeddingIndex.load(index, backend=backend)
    source = model_dir or idx.model_source
    if not source:
        raise InputError(f"{index} does not record the model it was built with; pass --model-dir")
    embedder = load_embedder(source, device, dtype)
    results = query_index(idx, embedder, items, top_k=top_k, show_progress_bar=False if quiet else None)
    for text, hits in zip(items, results, strict=True):
        if json_output:
            rows = [{"id": h.id, "score": round(h.score, 6), "text": h.text, "row": h.row} for h in hits]
            typer.echo(json.dumps({"query": text, "hits": rows}, ensure_ascii=False))
            continue
        typer.echo(f"# {text}")
        for rank, h in enumerate(hits, start=1):
            typer.echo(f"{rank}\t{h.score:.4f}\t{h.id}\t{h.text if h.text is not None else ''}")
