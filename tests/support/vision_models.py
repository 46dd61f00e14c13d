"""Tiny vision-language models built offline, saved as Hugging Face folders that ``AutoProcessor`` and
``AutoModelForImageTextToText`` load (about a second each):

- LLaVA (:func:`save_vlm_folder`): a 2-layer CLIP vision tower, 32 px images, 16 image tokens;
- Idefics3, SmolVLM's architecture (:func:`save_idefics3_folder`): a 2-layer SigLIP-style tower, 32 px images,
  pixel shuffle to 4 image tokens between ``<fake_token_around_image>`` markers (vLLM's CPU build runs it
  without torchvision, which its LLaVA needs);

each over a 2-layer random Llama, with a processor of Pillow image processor (no torchvision), the tests'
byte-level BPE tokenizer with the image tokens, and a chat template that places images among a message's parts.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.generation_models import build_tokenizer

# a chat template in the layout vision-language processors use: a message's content is a string or a list of parts
VISION_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
IMAGE_TOKENS = 16  # (32 px / 8 px patches)^2


def save_vlm_folder(path: Path, *, seed: int = 0, hidden_size: int = 64, heads: int = 4, init: float = 0.5) -> Path:
    """Save the tiny LLaVA and its processor to ``path``; vLLM's CPU kernels need ``hidden_size=128, heads=2``."""
    import torch
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

    try:  # the Pillow image processor: no torchvision needed
        from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil as ImageProcessor
    except ImportError:  # a transformers before the Pillow/torchvision split: its CLIPImageProcessor is Pillow's
        from transformers import CLIPImageProcessor as ImageProcessor

    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              image_size=32, patch_size=8, projection_dim=32)
    text = LlamaConfig(hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2,
                       num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), vocab_size=len(tokenizer),
                       max_position_embeddings=1024, initializer_range=init, pad_token_id=tokenizer.pad_token_id,
                       eos_token_id=tokenizer.eos_token_id, bos_token_id=None, tie_word_embeddings=False)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_id,
                         vision_feature_select_strategy="default", vision_feature_layer=-1,
                         image_seq_length=IMAGE_TOKENS, projector_hidden_act="gelu")
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).eval()
    # peaked vision features too: images that differ give different tokens (see build_model's initializer_range)
    with torch.no_grad():
        for param in model.model.multi_modal_projector.parameters():
            param.normal_(0, init)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    image_processor = ImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=8,
                               vision_feature_select_strategy="default", image_token="<image>",
                               num_additional_image_tokens=1, chat_template=VISION_CHAT_TEMPLATE)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


IDEFICS3_IMAGE_TOKENS = 4  # (32 px / 8 px patches)^2 / scale_factor^2


def save_idefics3_folder(path: Path, *, seed: int = 0, hidden_size: int = 64, heads: int = 4,
                         init: float = 0.5) -> Path:
    """Save the tiny Idefics3 and its processor to ``path`` (one 32 px image, no splitting into tiles)."""
    import torch
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor, LlamaConfig
    from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [
        "<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"]})
    vision = Idefics3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  image_size=32, patch_size=8)
    text = LlamaConfig(hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2,
                       num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), vocab_size=len(tokenizer),
                       max_position_embeddings=1024, initializer_range=init, pad_token_id=tokenizer.pad_token_id,
                       eos_token_id=tokenizer.eos_token_id, bos_token_id=None, tie_word_embeddings=False)
    config = Idefics3Config(vision_config=vision, text_config=text, scale_factor=2,
                            image_token_id=tokenizer.convert_tokens_to_ids("<image>"))
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for param in model.model.connector.parameters():
            param.normal_(0, init)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    image_processor = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": 32},
                                                max_image_size={"longest_edge": 32})
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer,
                                  image_seq_len=IDEFICS3_IMAGE_TOKENS, chat_template=VISION_CHAT_TEMPLATE)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def save_qwen2_vl_weights(path: Path) -> Path:
    """A tiny Qwen2-VL's weights and tokenizer, with an empty preprocessor config (its processor needs
    torchvision for videos): enough to load the model, which places image tokens with multimodal rotary
    positions."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|image_pad|>", "<|vision_start|>", "<|video_pad|>"]})
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("image_token_id", "<|image_pad|>"), ("vision_start_token_id", "<|vision_start|>"),
        ("video_token_id", "<|video_pad|>"))}
    config = Qwen2VLConfig(
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "patch_size": 14,
                       "spatial_merge_size": 2, "temporal_patch_size": 2},
        text_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "vocab_size": len(tokenizer), "bos_token_id": None,
                     "eos_token_id": tokenizer.eos_token_id,
                     "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
        **ids)
    Qwen2VLForConditionalGeneration(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "preprocessor_config.json").write_text("{}")
    return path
