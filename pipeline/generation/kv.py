"""The rows being decoded together: one KV cache, its padding mask and each row's next position.

The layout is the one ``model.generate`` uses for a left-padded batch: every
row's real tokens sit contiguously at the right end of the cache, padding on
the left, masked out by a 2D attention mask; RoPE positions count real
tokens only, so a row's keys and queries carry the same positions as when
it runs alone. That is what lets rows leave (:meth:`SlotBatch.keep`) and join
(:meth:`SlotBatch.merge`) between decoding steps without changing any row's
result: a row never attends to anything but its own tokens.

The cache is a ``transformers.DynamicCache`` whose per-layer tensors are
edited here (select rows, left-pad, concatenate, trim). Its length is at most
the longest row it holds, so memory is bounded by rows x max sequence length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["SlotBatch", "check_kv_budget", "kv_cache_bytes"]


def kv_cache_bytes(model_config: Any, *, rows: int, max_seq_len: int, bytes_per_value: int = 4) -> int:
    """Upper bound of the KV cache in bytes for ``rows`` sequences of at most ``max_seq_len`` tokens."""
    layers = int(model_config.num_hidden_layers)
    heads = int(getattr(model_config, "num_key_value_heads", None) or model_config.num_attention_heads)
    head_dim = int(getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads)
    return 2 * layers * rows * heads * max_seq_len * head_dim * bytes_per_value


def check_kv_budget(need: int, limit_mb: float | None, *, what: str, knob: str) -> None:
    """Refuse a KV cache of ``need`` bytes above ``limit_mb`` (``task.max_kv_cache_mb``), naming what to lower."""
    if limit_mb is not None and need > limit_mb * 2**20:
        raise ValueError(
            f"the KV cache can reach {need / 2**20:.0f} MiB ({what}) but max_kv_cache_mb is {limit_mb}; "
            f"lower {knob}, max_input_tokens or max_new_tokens_limit, or raise max_kv_cache_mb"
        )


def _layers(cache: Any) -> list[Any]:
    layers = list(getattr(cache, "layers", []))
    for layer in layers:
        if type(layer).__name__ != "DynamicLayer":
            raise NotImplementedError(
                f"slot batching edits full-attention DynamicCache layers only; this model's cache has "
                f"{type(layer).__name__} layers (sliding-window or linear attention). Use mode: static with "
                "slots: 1, or backend: vllm"
            )
    return layers


@dataclass
class SlotBatch:
    """``rows`` (caller's row objects, one per batch row), the cache, mask ``[rows, length]`` and positions."""

    rows: list[Any]
    cache: Any
    mask: Any  # torch.long [rows, length]: 1 real token, 0 padding
    next_pos: Any  # torch.long [rows]: position id of each row's next token (= its real length)

    @property
    def size(self) -> int:
        return len(self.rows)

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])

    @property
    def real_tokens(self) -> int:
        """Real (unpadded) tokens in the cache: after a prefill, the prompts' tokens."""
        return int(self.mask.sum())

    @property
    def padded_tokens(self) -> int:
        """Tokens the model computed, padding included: after a prefill, rows x the longest prompt."""
        return int(self.mask.numel())

    # ------------------------------------------------------------------ model calls
    @classmethod
    def prefill(cls, model: Any, rows: Sequence[Any], prompts: Sequence[Sequence[int]], *, pad_id: int,
                inputs: Sequence[dict[str, Any]] = ()) -> tuple["SlotBatch", Any]:
        """Run the left-padded ``prompts`` through ``model``; the batch and each row's last-token logits.

        ``inputs``: a vision-language model's per-row tensors (``pixel_values``...), stacked along their first
        dimension in row order: the model puts each image's features at its image tokens, in order, and
        afterwards the cache holds them, so decoding feeds tokens only.
        """
        import torch
        from transformers import DynamicCache

        device = model.device
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            if p:
                ids[i, width - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
                mask[i, width - len(p):] = 1
        # Same positions as generate(): real tokens count from 0, pads get 1 (ignored).
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        cache = DynamicCache(config=model.config)
        extra = {}
        for name in inputs[0] if inputs else ():
            stacked = torch.cat([row[name] for row in inputs]).to(device)
            extra[name] = stacked.to(model.dtype) if stacked.is_floating_point() else stacked
        with torch.inference_mode():
            out = model(
                input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                past_key_values=cache, use_cache=True, logits_to_keep=1, **extra,
            )
        batch = cls(list(rows), out.past_key_values, mask, mask.sum(-1))
        _layers(batch.cache)
        return batch, out.logits[:, -1, :]

    def decode(self, model: Any, tokens: Sequence[int]) -> Any:
        """Feed one token per row; returns the next-token logits ``[rows, vocab]``."""
        import torch

        if len(tokens) != self.size:
            raise ValueError(f"decode got {len(tokens)} tokens for {self.size} rows")
        device = model.device
        self.mask = torch.cat([self.mask, torch.ones((self.size, 1), dtype=torch.long)], dim=1)
        with torch.inference_mode():
            out = model(
                input_ids=torch.as_tensor(list(tokens), dtype=torch.long).view(-1, 1).to(device),
                attention_mask=self.mask.to(device), position_ids=self.next_pos.view(-1, 1).to(device),
                past_key_values=self.cache, use_cache=True, logits_to_keep=1,
            )
        self.cache = out.past_key_values
        self.next_pos = self.next_pos + 1
        return out.logits[:, -1, :]

    # ------------------------------------------------------------------ membership
    def keep(self, keep: Sequence[int]) -> None:
        """Keep only batch rows ``keep`` (in that order) and drop padding columns no row needs any more."""
        import torch

        if len(keep) == self.size and list(keep) == list(range(self.size)):
            return
        index = torch.as_tensor(list(keep), dtype=torch.long)
        self.rows = [self.rows[i] for i in keep]
        self.mask = self.mask.index_select(0, index)
        self.next_pos = self.next_pos.index_select(0, index)
        if not self.rows:
            self.cache = None
            return
        # Rows are right-aligned, so the shortest padding is the number of leading columns all rows ignore.
        lead = int((self.mask.shape[1] - self.mask.sum(-1)).min())
        for layer in _layers(self.cache):
            dev_index = index.to(layer.keys.device)
            layer.keys = layer.keys.index_select(0, dev_index)[:, :, lead:, :]
            layer.values = layer.values.index_select(0, dev_index)[:, :, lead:, :]
        self.mask = self.mask[:, lead:]

    def merge(self, other: "SlotBatch") -> None:
        """Append ``other``'s rows, left-padding whichever cache is shorter (with zeros, masked out)."""
        import torch

        if other.size == 0:
            return
        if self.size == 0:
            self.rows, self.cache, self.mask, self.next_pos = other.rows, other.cache, other.mask, other.next_pos
            return
        width = max(self.length, other.length)

        def left_pad(t: Any, n: int) -> Any:
            if n == 0:
                return t
            shape = list(t.shape)
            shape[-2 if t.dim() == 4 else -1] = n
            pad = torch.zeros(shape, dtype=t.dtype, device=t.device)
            return torch.cat([pad, t], dim=-2 if t.dim() == 4 else -1)

        pad_self, pad_other = width - self.length, width - other.length
        for mine, theirs in zip(_layers(self.cache), _layers(other.cache)):
            mine.keys = torch.cat([left_pad(mine.keys, pad_self), left_pad(theirs.keys, pad_other)], dim=0)
            mine.values = torch.cat([left_pad(mine.values, pad_self), left_pad(theirs.values, pad_other)], dim=0)
        self.mask = torch.cat([left_pad(self.mask, pad_self), left_pad(other.mask, pad_other)], dim=0)
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        self.rows = self.rows + other.rows
