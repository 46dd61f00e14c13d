"""Which grammar library constrains the transformers backend: xgrammar against lm-format-enforcer, measured.

Same model (SmolLM2-135M-Instruct), same prompts, same review schema, greedy,
one row at a time with a KV cache, so the only difference is the library:
the time to prepare the tokenizer and compile the schema, the time to build
each step's allowed-token mask, and whether the output parses.

    python bench/bench_grammar_libs.py --model .cache/models/smollm2-135m-instruct --rows 8

outlines is not measured: its current releases build on outlines-core and
pull a dependency tree (and a transformers integration) far larger than the
other two; vLLM's own default backend is xgrammar.
"""

from __future__ import annotations

import argparse
import json
import time

SCHEMA = {
    "type": "object",
    "properties": {
        "sentiment": {"enum": ["positive", "negative", "mixed"]},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "aspects": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["sentiment", "rating", "aspects"],
    "additionalProperties": False,
}
REVIEWS = [
    "A charming, funny ride with a big heart and two great leads.",
    "A dull, plodding mess that never finds its footing.",
    "The acting is superb but the story drags in the middle.",
    "One of the best movies of the year: smart, moving and beautifully shot.",
    "Loud, long and empty; the effects cannot save the script.",
    "An uneven comedy with a few good jokes and a weak ending.",
    "Gorgeous animation, a forgettable plot.",
    "Tense, clever and never lets go.",
]


class XgrammarMask:
    name = "xgrammar"

    def __init__(self, tokenizer, vocab_size: int) -> None:
        import xgrammar as xgr

        started = time.perf_counter()
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.compiler = xgr.GrammarCompiler(self.info)
        self.tokenizer_s = time.perf_counter() - started
        started = time.perf_counter()
        self.grammar = self.compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
        self.compile_s = time.perf_counter() - started
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self.xgr = xgr

    def start(self) -> None:
        self.matcher = self.xgr.GrammarMatcher(self.grammar)

    def apply(self, logits, _tokens) -> None:
        self.matcher.fill_next_token_bitmask(self.bitmask)
        self.xgr.apply_token_bitmask_inplace(logits, self.bitmask)

    def accept(self, token: int) -> None:
        self.matcher.accept_token(token)


class FormatEnforcerMask:
    """lm-format-enforcer's core. Its transformers integration (0.11.3) does not import with transformers 5
    (``transformers.tokenization_utils.PreTrainedTokenizerBase`` is gone), so the tokenizer data is built here
    the way that integration builds it."""

    name = "lm-format-enforcer"

    def __init__(self, tokenizer, vocab_size: int) -> None:
        from lmformatenforcer import JsonSchemaParser, TokenEnforcer, TokenEnforcerTokenizerData

        started = time.perf_counter()
        special = set(tokenizer.all_special_ids)
        zero = tokenizer.encode("0", add_special_tokens=False)[0]
        base = tokenizer.decode([zero])
        regular = []
        for i in range(len(tokenizer)):
            if i in special:
                continue
            text = tokenizer.decode([zero, i])[len(base):]
            regular.append((i, text, tokenizer.convert_ids_to_tokens(i).startswith("\u0120")))
        data = TokenEnforcerTokenizerData(regular, tokenizer.decode, [tokenizer.eos_token_id], False, vocab_size)
        self.tokenizer_s = time.perf_counter() - started
        started = time.perf_counter()
        self.enforcer = TokenEnforcer(data, JsonSchemaParser(SCHEMA))
        self.enforcer.get_allowed_tokens([])  # the first call builds the parser's state
        self.compile_s = time.perf_counter() - started
        self.vocab_size = vocab_size

    def start(self) -> None:
        self.prefix: list[int] = []

    def apply(self, logits, _tokens) -> None:
        import torch

        allowed = self.enforcer.get_allowed_tokens(self.prefix).allowed_tokens
        mask = torch.full((logits.shape[-1],), float("-inf"))
        mask[allowed] = 0
        logits += mask

    def accept(self, token: int) -> None:
        self.prefix.append(token)


def generate(model, tokenizer, prompt_ids, mask, max_new: int) -> tuple[list[int], float, float]:
    """Greedy decoding with a KV cache; returns tokens, total seconds, seconds spent in the mask."""
    import torch

    eos = tokenizer.eos_token_id
    ids = torch.tensor([prompt_ids])
    past, out, mask_s = None, [], 0.0
    started = time.perf_counter()
    if mask is not None:
        mask.start()
    with torch.inference_mode():
        for _ in range(max_new):
            res = model(input_ids=ids, past_key_values=past, use_cache=True)
            past, logits = res.past_key_values, res.logits[0, -1].float()
            if mask is not None:
                t = time.perf_counter()
                mask.apply(logits.unsqueeze(0) if mask.name == "xgrammar" else logits, out)
                mask_s += time.perf_counter() - t
            token = int(logits.argmax())
            out.append(token)
            if token == eos:
                break
            if mask is not None:
                mask.accept(token)
            ids = torch.tensor([[token]])
    return out, time.perf_counter() - started, mask_s


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=".cache/models/smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=48)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    instruction = ("Extract from the movie review a JSON object with sentiment (positive, negative or mixed), "
                   "rating (1-5) and up to three aspects. Review: ")
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": instruction + r}], tokenize=False,
                                             add_generation_prompt=True) for r in REVIEWS[: args.rows]]
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    for lib in (None, XgrammarMask, FormatEnforcerMask):
        mask = lib(tokenizer, vocab) if lib else None
        tokens = seconds = mask_s = valid = 0
        for ids in prompt_ids:
            out, s, m = generate(model, tokenizer, ids, mask, args.max_new)
            text = tokenizer.decode([t for t in out if t != tokenizer.eos_token_id], skip_special_tokens=True)
            try:
                json.loads(text)
                valid += 1
            except json.JSONDecodeError:
                pass
            tokens, seconds, mask_s = tokens + len(out), seconds + s, mask_s + m
        print(json.dumps({
            "library": mask.name if mask else "none (free decoding)", "rows": len(prompt_ids),
            "valid_json": valid, "tokens": tokens, "tokens_per_s": round(tokens / seconds, 1),
            "mask_ms_per_token": round(1000 * mask_s / max(tokens, 1), 3),
            "tokenizer_prep_s": round(getattr(mask, "tokenizer_s", 0.0), 3),
            "schema_compile_s": round(getattr(mask, "compile_s", 0.0), 3),
        }))


if __name__ == "__main__":
    main()
