"""Prompts from row columns: a ``str.format`` template, the model's chat template, explicit truncation.

The template names the columns it needs (``"Summarise: {text}"`` needs
``text``), so the task can declare its input columns before any work. When
a prompt is longer than ``max_input_tokens`` only the column values are cut
(keeping their start or their end), never the template text, the system
prompt or the chat scaffolding, and the row is flagged truncated.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from pipeline.errors import PromptError

__all__ = ["Prompt", "PromptBuilder", "PromptError", "template_fields"]

Truncation = Literal["keep_start", "keep_end"]

# Values longer than this many characters per allowed token are clipped before
# tokenising (a 1 MB cell would otherwise cost seconds); such rows are truncated anyway.
_CHARS_PER_TOKEN_CAP = 16


def template_fields(template: str) -> tuple[str, ...]:
    """The column names ``template`` uses, in first-use order.

    >>> template_fields("Review: {text}\\nTitle: {title}. Again: {text}")
    ('text', 'title')
    """
    names: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise PromptError(f"template {template!r} is not a valid str.format template: {exc}") from None
    for _, name, _, _ in parsed:
        if name is None:
            continue
        if not name.isidentifier():
            raise PromptError(
                f"template field {{{name}}} must be a plain column name (no positional fields, "
                "attributes or indexes); write literal braces as {{ and }}"
            )
        if name not in names:
            names.append(name)
    if not names:
        raise PromptError(f"template {template!r} uses no column; add one, e.g. 'Summarise: {{text}}'")
    return tuple(names)


@dataclass(frozen=True)
class Prompt:
    """A built prompt: its token ids and whether any column value was cut to fit."""

    token_ids: list[int]
    truncated: bool
    # the rendered prompt, when asked for (``PromptBuilder.build(..., with_text=True)``): a processor reads text
    text: str | None = None


class PromptBuilder:
    """Builds token ids for rows: template -> (chat template) -> tokens, within ``max_input_tokens``.

    ``use_chat_template`` is ``True``, ``False`` or ``"auto"`` (use it when the
    tokenizer has one). With a chat template the rendered template is the user
    message, after an optional system message.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        template: str,
        use_chat_template: bool | Literal["auto"] = "auto",
        system_prompt: str | None = None,
        max_input_tokens: int = 512,
        truncation: Truncation = "keep_start",
    ) -> None:
        if truncation not in ("keep_start", "keep_end"):
            raise PromptError(f"truncation must be 'keep_start' or 'keep_end', got {truncation!r}")
        has_chat = self._has_chat_template(tokenizer)
        if use_chat_template is True and not has_chat:
            raise PromptError(
                "use_chat_template is true but this tokenizer has no chat template; "
                "set use_chat_template: false (or auto) for a base model"
            )
        if system_prompt is not None and not (has_chat and use_chat_template is not False):
            raise PromptError("system_prompt needs a chat template; put the instruction in the template instead")
        self.tokenizer = tokenizer
        self.template = template
        self.fields = template_fields(template)
        self.chat = has_chat and use_chat_template is not False
        self.system_prompt = system_prompt
        self.max_input_tokens = max_input_tokens
        self.truncation = truncation
        scaffold = len(self._encode({name: "" for name in self.fields}))
        if scaffold >= max_input_tokens:
            raise PromptError(
                f"the template and chat scaffolding alone take {scaffold} tokens, leaving nothing of "
                f"max_input_tokens {max_input_tokens} for the row text; raise max_input_tokens above {scaffold}"
            )
        self.scaffold_tokens = scaffold

    def _has_chat_template(self, tokenizer: Any) -> bool:
        return bool(getattr(tokenizer, "chat_template", None))

    def render(self, values: Mapping[str, str]) -> str:
        """The prompt text for one row (chat template applied when in use)."""
        user = self.template.format(**{name: values[name] for name in self.fields})
        if not self.chat:
            return user
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []
        messages.append({"role": "user", "content": user})
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def _encode(self, values: Mapping[str, str]) -> list[int]:
        # A chat template writes its own special tokens (BOS, role markers); a plain prompt gets the tokenizer's.
        return list(self.tokenizer(self.render(values), add_special_tokens=not self.chat)["input_ids"])

    def build(self, values: Mapping[str, str], *, budget: int | None = None, with_text: bool = False) -> Prompt:
        """The prompt for one row; column values are cut (``truncation`` side) until it fits ``budget`` tokens
        (``max_input_tokens`` unless given); ``with_text``: the rendered text too."""
        budget = self.max_input_tokens if budget is None else budget
        cap = self.max_input_tokens * _CHARS_PER_TOKEN_CAP
        values = {name: str(values[name]) for name in self.fields}
        clipped = False
        for name, value in values.items():
            if len(value) > cap:
                values[name] = value[:cap] if self.truncation == "keep_start" else value[-cap:]
                clipped = True
        ids = self._encode(values)
        truncated = clipped
        while len(ids) > budget:
            truncated = True
            over = len(ids) - budget
            # Cut the longest value: one long review shrinks, a short title survives.
            pieces = {n: self.tokenizer(v, add_special_tokens=False)["input_ids"] for n, v in values.items()}
            name = max(pieces, key=lambda n: len(pieces[n]))
            piece = pieces[name]
            if not piece:  # nothing left to cut: only a budget below max_input_tokens gets here
                raise PromptError(f"prompt cannot fit {budget} tokens: the template and scaffolding alone take "
                                  f"{len(ids)}")
            keep = max(0, len(piece) - over)
            kept = piece[:keep] if self.truncation == "keep_start" else piece[len(piece) - keep:]
            text = self.tokenizer.decode(kept, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            # Re-tokenising decoded text can merge differently; never let a cut grow the value back.
            if len(text) >= len(values[name]):
                text = values[name][:-1] if self.truncation == "keep_start" else values[name][1:]
            values[name] = text
            ids = self._encode(values)
        return Prompt(ids, truncated, self.render(values) if with_text else None)
