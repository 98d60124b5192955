"""Rebuild the generic token prior that ``--calibrator auto`` weights with (src/bertflow/encoding/priors/).

    python benchmarks/build_token_prior.py --corpus ../shared/data/gutenberg/sentences-100k.txt.gz \
        --model ../shared/models/bert-gutenberg-L6-H384

Counts the corpus with the encoder's own tokenizer exactly as ``Embedder.fit`` counts fitting sentences
(``SentenceEncoder.count_tokens``: special tokens included, the encoder's max_length), and records the
vocabulary digest that decides which encoders the prior applies to (here: every BERT uncased WordPiece
vocabulary of 30,522 tokens, e.g. bert-base-uncased, all-MiniLM-L6-v2, bert-gutenberg-L6-H384).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bertflow.encoding.encoder import SentenceEncoder
from bertflow.encoding.token_prior import PRIOR_CONFIG, PRIORS_DIR, vocab_digest
from bertflow.io.text import read_sentences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, type=Path)
    parser.add_argument("--model", required=True)
    parser.add_argument("--name", default="gutenberg-100k-wordpiece-uncased")
    parser.add_argument("--max-length", type=int, default=64)
    args = parser.parse_args()
    encoder = SentenceEncoder(args.model, pooling="mean", max_length=args.max_length, device="cpu")
    sentences = read_sentences(args.corpus)
    stats = encoder.count_tokens(sentences)
    folder = PRIORS_DIR / args.name
    folder.mkdir(parents=True, exist_ok=True)
    stats.save(folder)
    meta = {
        "vocab_digest": vocab_digest(encoder.tokenizer),
        "source": f"{len(sentences):,} English sentences of public-domain Project Gutenberg books "
        f"({args.corpus.name}), WordPiece uncased, max_length {args.max_length}",
        "n_sentences": stats.n_sentences,
        "n_tokens": stats.n_tokens,
    }
    (folder / PRIOR_CONFIG).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    print(folder, stats)


if __name__ == "__main__":
    main()
