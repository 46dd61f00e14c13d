"""Vision-language models for ``generate`` and ``extract``: the folder, its processor, and each row's image prompt.

A vision-language folder (``AutoModelForImageTextToText``: LLaVA, Idefics3 and
SmolVLM, Gemma 3, PaliGemma...) comes with a processor (``AutoProcessor``): its
image processor resizes and normalises the image, its chat template puts the
image's placeholder among the message's parts, and calling it on the rendered
text and the image expands that placeholder into the image's tokens.

:class:`VisionPromptBuilder` is the text prompt builder with the image as one
template field: ``"Describe {image}"`` puts the image where ``{image}`` is (the
image column's name), a template that does not name it puts the image before
the text. The text is cut to ``max_input_tokens`` as for any prompt, counting
the image's tokens, never cutting them (:meth:`VisionPromptBuilder.build_row`).

The transformers backend batches these rows in its slot batches: the image's
features enter the KV cache at prefill, decoding is text alone. That holds for
models whose language model takes plain positions; a model that computes
multimodal rotary positions from the image grid (Qwen2-VL and its family) is
refused there, with the backend that runs it (vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

from pipeline.errors import PromptError
from pipeline.generation.prompts import PromptBuilder, Truncation
from pipeline.models.loading import ModelError, load_pretrained, read_model_config

__all__ = ["ImagePrompt", "VisionPromptBuilder", "check_vision_lm", "is_vision_lm", "load_vision_lm"]

_MARK = "\x00image\x00"  # where the image goes in the rendered user message, until it becomes a placeholder
_INPUT_IDS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")


def is_vision_lm(path: Path) -> bool:
    """Whether ``path``'s config names an image-text-to-text architecture (it has a vision tower's config)."""
    return "vision_config" in read_model_config(path)


def check_vision_lm(path: Path) -> None:
    """Fail with what to do unless ``path`` holds an image-text-to-text model and its processor."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    config = read_model_config(path)
    model_type = config.get("model_type")
    if model_type not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        raise ModelError(
            f"model folder {path} is not a vision-language model (model_type {model_type!r}, architectures "
            f"{config.get('architectures') or 'none'}); task.image_column needs an image-text-to-text folder "
            "(AutoModelForImageTextToText: LLaVA, Idefics3/SmolVLM, Gemma 3...) with its processor")
    if not any((path / name).is_file() for name in ("processor_config.json", "preprocessor_config.json")):
        raise ModelError(f"model folder {path} has no processor_config.json or preprocessor_config.json: save the "
                         "model's processor beside it (processor.save_pretrained(folder))")


def load_vision_lm(path: Path, *, device: str = "cpu", precision: str = "fp32",
                   allow_pickle: bool = False) -> tuple[Any, Any]:
    """``(processor, model)`` of a vision-language folder, eval mode, on ``device``.

    Refuses a model whose language model takes multimodal rotary positions (it has ``get_rope_index``): the
    transformers backend's slot batches give each row plain positions.
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor

    check_vision_lm(path)
    _, model = load_pretrained(path, AutoModelForImageTextToText, device=str(device), precision=precision,
                            what="vision-language model", allow_pickle=allow_pickle, cast_on_cpu=True)
    if hasattr(getattr(model, "model", model), "get_rope_index"):
        raise ModelError(
            f"{type(model).__name__} ({path}) places its image tokens with multimodal rotary positions, which "
            "the transformers backend's batches do not compute; run it on task.backend: vllm")
    processor = AutoProcessor.from_pretrained(str(path), local_files_only=True)
    if getattr(processor, "image_token", None) is None:
        raise ModelError(f"the processor of {path} ({type(processor).__name__}) names no image_token; the "
                         "task cannot place the image in the prompt")
    return processor, model


@dataclass(frozen=True)
class ImagePrompt:
    """One row's prompt with its image: the token ids, the model inputs beside them, whether text was cut."""

    token_ids: list[int]
    inputs: dict[str, Any]
    truncated: bool
    image_tokens: int


class VisionPromptBuilder(PromptBuilder):
    """A :class:`PromptBuilder` whose template field ``image_field`` is the row's image.

    ``expand``: the transformers backend's prompt holds the image's tokens (the processor expanded them) and
    its inputs the pixels; without it (vLLM) the prompt keeps one placeholder and the engine expands it.
    """

    def __init__(self, processor: Any, *, image_field: str, template: str,
                 use_chat_template: bool | Literal["auto"] = "auto", system_prompt: str | None = None,
                 max_input_tokens: int = 512, truncation: Truncation = "keep_start", expand: bool = True) -> None:
        self.processor = processor
        self.image_field = image_field
        self.image_token = str(processor.image_token)
        self.expand = expand
        super().__init__(processor.tokenizer, template=template,
                         use_chat_template=use_chat_template, system_prompt=system_prompt,
                         max_input_tokens=max_input_tokens, truncation=truncation)

    def _has_chat_template(self, tokenizer: Any) -> bool:
        return bool(getattr(self.processor, "chat_template", None) or getattr(tokenizer, "chat_template", None))

    def render(self, values: Mapping[str, str]) -> str:
        """The prompt text with the processor's image placeholder where the image goes."""
        fields = {name: (_MARK if name == self.image_field else values[name]) for name in self.fields}
        user = self.template.format(**fields)
        before, marked, after = user.partition(_MARK)
        if not marked:  # the template does not name the image: it goes first, as chat templates show it
            before, after = "", user
        if not self.chat:
            return before + self.image_token + after
        parts = ([{"type": "text", "text": before}] if before else []) + [{"type": "image"}] + (
            [{"type": "text", "text": after}] if after else [])
        messages = ([{"role": "system", "content": [{"type": "text", "text": self.system_prompt}]}]
                    if self.system_prompt is not None else [])
        messages.append({"role": "user", "content": parts})
        owner = self.processor if getattr(self.processor, "chat_template", None) else self.tokenizer
        return owner.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def build_row(self, values: Mapping[str, str], image: Any) -> ImagePrompt:
        """The row's prompt with ``image`` (a PIL image): within ``max_input_tokens`` counting the image's
        tokens; the text is cut when it must be, the image never."""
        values = {**values, self.image_field: ""}
        prompt = self.build(values, with_text=True)
        ids, inputs = self._process(prompt.text or "", image)
        image_tokens = len(ids) - len(prompt.token_ids) + 1
        truncated = prompt.truncated
        if len(ids) > self.max_input_tokens:
            budget = self.max_input_tokens - image_tokens + 1
            if budget <= self.scaffold_tokens:
                raise PromptError(f"the image takes {image_tokens} tokens, which with the template leaves nothing "
                                  f"of max_input_tokens {self.max_input_tokens}; raise task.max_input_tokens")
            prompt = self.build(values, budget=budget, with_text=True)
            ids, inputs = self._process(prompt.text or "", image)
            truncated = True
        if not self.expand:
            ids = prompt.token_ids
        return ImagePrompt(ids, inputs, truncated, image_tokens)

    def _process(self, text: str, image: Any) -> tuple[list[int], dict[str, Any]]:
        encoded = self.processor(text=[text], images=[image], add_special_tokens=not self.chat, return_tensors="pt")
        ids = encoded["input_ids"][0].tolist()
        return ids, {k: v for k, v in encoded.items() if k not in _INPUT_IDS}
