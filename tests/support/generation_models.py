"""Tiny offline tokenizer and random Llama for the generation tests (no hub, built in ~1 s).

The tokenizer is a byte-level BPE trained on a few sentences, so any text
encodes (no unknown tokens) and truncation meets real merge boundaries. The
model's weights are drawn with a large ``initializer_range``: a default
(0.02) random model has near-uniform logits, where greedy argmax ties would
hang on float noise; peaked logits make exactness checks meaningful (a wrong
position id or mask changes the tokens) rather than flaky.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CORPUS = [
    "the film is a charming and funny ride with a big heart",
    "a dull, plodding mess that never finds its footing",
    "summarise the review in one sentence",
    "label the sentiment of this review as positive or negative",
    "the acting is superb but the story drags in the middle",
    "one of the best movies of the year, smart and moving",
    "review: an uneven comedy. sentiment: negative. summary: uneven.",
]
SPECIALS = ["<|pad|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]

# the tiny random Llama of the vLLM modules (64-dim heads, the smallest vLLM's CPU attention kernels take) and the
# API key of vLLM's server on it (tests/generation/conftest.py)
VLLM_SHAPE = {"hidden_size": 128, "heads": 2}
VLLM_KEY = "sk-vllm-test-5555"

# the extract kind's schemas: every supported feature (enum, bounded integer, boolean, number, array with
# maxItems, nested object, nullable), and a short one the tiny random model finishes in a few dozen tokens
EXTRACT_FULL_SCHEMA = {
    "type": "object",
    "properties": {
        "sentiment": {"enum": ["positive", "negative", "mixed"]},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "spoiler": {"type": "boolean"},
        "score": {"type": "number"},
        "aspects": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
        "source": {"type": "object", "properties": {"code": {"type": ["string", "null"], "maxLength": 4}},
                   "required": ["code"]},
    },
    "required": ["sentiment", "rating", "spoiler", "aspects", "source"],
    "additionalProperties": False,
}
EXTRACT_SHORT_SCHEMA = {
    "type": "object",
    "properties": {"sentiment": {"enum": ["positive", "negative"]}, "spoiler": {"type": "boolean"},
                   "rating": {"type": "integer", "minimum": 1, "maximum": 5}},
    "required": ["sentiment", "spoiler", "rating"],
    "additionalProperties": False,
}


def build_tokenizer(*, chat_template: bool = True):
    """A ``PreTrainedTokenizerFast`` with pad/eos tokens and (optionally) a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|eos|>")
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer, *, seed: int = 0, init: float = 0.5, hidden_size: int = 64, heads: int = 4):
    """A 2-layer random ``LlamaForCausalLM`` in fp32, eval mode, default attention.

    vLLM's CPU attention kernels take head sizes of 32 and up: build those with ``hidden_size=128, heads=2``.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        vocab_size=len(tokenizer), max_position_embeddings=1024, initializer_range=init,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def save_model_folder(path: Path, *, chat_template: bool = True, seed: int = 0, **shape: int) -> Path:
    """Save the tiny tokenizer and model as a Hugging Face folder (config, safetensors, tokenizer)."""
    tokenizer = build_tokenizer(chat_template=chat_template)
    model = build_model(tokenizer, seed=seed, **shape)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def reference_generate(model, tokenizer, prompt_ids, max_new_tokens: int) -> list[int]:
    """Unbatched greedy ``model.generate`` on one unpadded prompt: the ground truth."""
    import torch

    ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    with torch.inference_mode():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )
    return out[0, ids.shape[1]:].tolist()


POISON = "<|not-in-the-model|>"


def save_mismatched_folder(path: Path, **shape: int) -> Path:
    """A model folder whose tokenizer knows one token more than the model: text with ``POISON`` is a poison row.

    A real-world mistake (a tokenizer from a newer checkpoint): that row's token id is past the
    model's vocabulary, so the model (or vLLM's input check) rejects it, and only it.
    """
    from transformers import AutoTokenizer

    save_model_folder(path, **shape)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokenizer.add_tokens([POISON], special_tokens=False)
    tokenizer.save_pretrained(path)
    return path


def generate_job(tmp_path: Path, model_dir: Path, texts: list, task: dict, *, id_prefix: str = "g",
                 kind: str = "generate", columns: dict | None = None, run: dict | None = None):
    """A ``generate`` (or ``kind``) job over a Delta table of ``texts`` (ids ``<prefix>00``...) and any other
    ``columns``, writing to ``tmp_path/out``; ``run`` adds run settings."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from pipeline.config import build_config

    ids = [f"{id_prefix}{i:02d}" for i in range(len(texts))]
    write_deltalake(str(tmp_path / "reviews"),
                    pa.table({"doc_id": ids, "text": pa.array(texts, pa.string()), **(columns or {})}))
    return build_config({
        "job": "generate_test",
        "source": {"format": "delta", "path": str(tmp_path / "reviews"), "id_column": "doc_id"},
        "model": {"path": str(model_dir), "name": model_dir.name},
        "task": {"kind": kind, **task},
        "sink": {"path": str(tmp_path / "out"), "mode": "overwrite_partition"},
        "run": {"progress": False, "ds": "2026-11-30", **(run or {})},
    })
