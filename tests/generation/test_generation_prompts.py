"""Prompt building: templates, chat templates, truncation that never cuts the scaffolding."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from tests.support.generation_models import build_tokenizer  # noqa: E402
from pipeline.generation.prompts import PromptBuilder, PromptError, template_fields  # noqa: E402

LONG = " ".join(f"word{i}" for i in range(200))


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _text(tok, prompt) -> str:
    return tok.decode(prompt.token_ids, skip_special_tokens=False)


def test_template_fields_in_first_use_order():
    assert template_fields("Title: {title}\n{text} ({title})") == ("title", "text")
    for bad in ("no fields", "{0}", "{text.upper}", "{text[0]}", "{text"):
        with pytest.raises(PromptError):
            template_fields(bad)
    assert template_fields("literal {{braces}} and {text}") == ("text",)


def test_chat_template_and_system_prompt(tok):
    builder = PromptBuilder(tok, template="Label: {text}", system_prompt="Be brief.", max_input_tokens=200)
    prompt = builder.build({"text": "a fine film"})
    assert _text(tok, prompt) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nLabel: a fine film<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert not prompt.truncated


def test_plain_template_without_chat(tok):
    builder = PromptBuilder(tok, template="Label: {text} ->", use_chat_template=False, max_input_tokens=64)
    assert _text(tok, builder.build({"text": "a fine film"})) == "Label: a fine film ->"
    with pytest.raises(PromptError, match="system_prompt needs a chat template"):
        PromptBuilder(tok, template="{text}", use_chat_template=False, system_prompt="x")
    with pytest.raises(PromptError, match="no chat template"):
        PromptBuilder(build_tokenizer(chat_template=False), template="{text}", use_chat_template=True)
    auto = PromptBuilder(build_tokenizer(chat_template=False), template="{text}!", max_input_tokens=16)
    assert _text(tok, auto.build({"text": "ok"})) == "ok!"


@pytest.mark.parametrize("side", ["keep_start", "keep_end"])
def test_truncation_cuts_only_the_value(tok, side):
    builder = PromptBuilder(tok, template="Summarise: {text} [end]", max_input_tokens=40, truncation=side)
    prompt = builder.build({"text": LONG})
    text = _text(tok, prompt)
    assert prompt.truncated and len(prompt.token_ids) <= 40
    head = "<|im_start|>user\nSummarise: "
    tail = " [end]<|im_end|>\n<|im_start|>assistant\n"
    assert text.startswith(head) and text.endswith(tail)
    kept = text[len(head) : -len(tail)]
    assert 0 < len(kept) < len(LONG)
    assert LONG.startswith(kept) if side == "keep_start" else LONG.endswith(kept)
    # the budget is used, not thrown away: one more word would not fit
    assert len(prompt.token_ids) > 40 - 4


def test_truncation_cuts_the_longest_value_first(tok):
    builder = PromptBuilder(tok, template="{title}: {text}", use_chat_template=False, max_input_tokens=30)
    prompt = builder.build({"title": "the film", "text": LONG})
    text = _text(tok, prompt)
    assert prompt.truncated and text.startswith("the film: word0 word1")


def test_scaffold_longer_than_the_budget_is_a_config_error(tok):
    with pytest.raises(PromptError, match="raise max_input_tokens above"):
        PromptBuilder(tok, template="Summarise the review in one sentence: {text}", max_input_tokens=8)


def test_huge_values_are_clipped_before_tokenising(tok):
    builder = PromptBuilder(tok, template="{text}", use_chat_template=False, max_input_tokens=10)
    prompt = builder.build({"text": "x" * 1_000_000})
    assert prompt.truncated and len(prompt.token_ids) <= 10
