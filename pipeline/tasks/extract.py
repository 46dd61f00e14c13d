"""``extract``: fill a JSON Schema's fields from each row with a causal LM, as a typed ``fields`` struct.

The ``generate`` task with three differences:

- the model is constrained to the schema while it decodes (``constrained``,
  on by default): on the transformers backend by xgrammar
  (``pipeline.generation.grammar``: the grammar compiled once per worker,
  one grammar state per row, so continuous batching keeps working), on the
  vLLM backend by vLLM's structured outputs;
- each completion is parsed and checked against the schema
  (``pipeline.generation.schema``); a row whose completion does not pass (cut
  off at ``max_new_tokens``, or free decoding that rambled) gets status
  ``invalid_output`` with the reason and goes to the quarantine table, under
  the run's error budget like any failed row;
- the output has a ``fields`` struct column whose sub-fields and types follow
  the schema (enums as strings, arrays as lists, nested objects as structs),
  before the ``generate`` columns (the raw ``completion`` among them).

The schema goes into the prompt too (``schema_in_prompt``): constrained
decoding decides the form, and the model still needs to know what the fields
mean.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Mapping, Union

import numpy as np
import pyarrow as pa
from pydantic import Field, field_validator

from pipeline.generation.engine import GenerationResult
from pipeline.generation.schema import arrow_type, check_schema, load_schema, parse_completion
from pipeline.registry import register_task
from pipeline.core.rows import INVALID_OUTPUT, STATUS_FIELDS, Status
from pipeline.tasks._endpoint import EndpointJob
from pipeline.tasks._generate_columns import RESULT_FIELDS
from pipeline.tasks.generate import GenerateTask, GenerateTaskConfig

__all__ = ["INVALID_OUTPUT", "ExtractTask", "ExtractTaskConfig"]

# how much of a rejected completion the error message quotes
_QUOTE_CHARS = 160


class ExtractTaskConfig(GenerateTaskConfig):
    """Structured extraction: a JSON Schema's fields from each row, constrained decoding, a typed struct column."""

    kind: Literal["extract"] = "extract"  # type: ignore[assignment]
    output_schema: Union[dict[str, Any], str] = Field(
        ..., description="JSON Schema of the fields (inline, or a .json file path read at config time); objects "
        "with string (`maxLength`), integer, number, boolean and enum properties, arrays (`maxItems`), nested "
        "objects, `required`, `minimum`/`maximum`, `[\"<type>\", \"null\"]`")
    constrained: bool = Field(
        True, description="constrain decoding to the schema (xgrammar; vLLM: its structured outputs); "
        "false: free decoding, checked afterwards (for measuring what the constraint buys)")
    schema_in_prompt: bool = Field(
        True, description="append the schema to the system prompt, so the model knows what the fields mean")

    @field_validator("output_schema", mode="after")
    @classmethod
    def _schema(cls, value: Union[Mapping[str, Any], str]) -> dict[str, Any]:
        schema = load_schema(value)
        check_schema(schema)
        return schema


class ExtractTask(GenerateTask):
    """The ``extract`` task (see the module docstring)."""

    kind = "extract"

    def __init__(self, config: ExtractTaskConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        from jsonschema import Draft202012Validator

        self.schema: dict[str, Any] = dict(config.output_schema)  # type: ignore[arg-type]
        self.fields_type = arrow_type(self.schema)
        self._validator = Draft202012Validator(self.schema)

    @classmethod
    def extras(cls, config: ExtractTaskConfig, model: Any) -> tuple[str, ...]:
        """The generation extras, and jsonschema/xgrammar for the schema (:mod:`pipeline.core.extras`)."""
        return (*super().extras(config, model), "extract")

    def output_schema(self) -> pa.Schema:
        return pa.schema([pa.field("fields", self.fields_type), *RESULT_FIELDS, *STATUS_FIELDS])

    def profile_output(self, out: pa.RecordBatch, profile: Any) -> None:
        """As ``generate``, and the share of answers valid against the output schema."""
        from pipeline.tasks._profile import profile_schema_valid

        super().profile_output(out, profile)
        profile_schema_valid(out, profile)

    def system_prompt(self) -> str | None:
        base = self.config.system_prompt
        if not self.config.schema_in_prompt:
            return base
        ask = ("Answer with one JSON object and nothing else. It must follow this JSON Schema: "
               + json.dumps(self.schema, separators=(",", ":")))
        return f"{base}\n{ask}" if base else ask

    def constraint(self, tokenizer: Any, model: Any) -> Any:
        if not self.config.constrained:
            return None
        from pipeline.generation.engine import eos_ids
        from pipeline.generation.grammar import JsonConstraint

        # compiled here, in load: once per worker, cached with the model (pipeline.models.cache); a
        # vision-language model's logits are its language model's
        text_config = getattr(model.config, "get_text_config", lambda: model.config)()
        return JsonConstraint.compile(tokenizer, self.schema, vocab_size=text_config.vocab_size,
                                      stop_token_ids=sorted(eos_ids(model, tokenizer)))

    def vllm_json_schema(self) -> dict[str, Any] | None:
        return self.schema if self.config.constrained else None

    def check_outputs(self, results: list[GenerationResult | None], status: np.ndarray,
                      error: np.ndarray) -> list[pa.Array]:
        fields: list[dict | None] = [None] * len(results)
        for i, result in enumerate(results):
            if result is None or status[i] not in (Status.OK, Status.TRUNCATED):
                continue
            value, reason = parse_completion(result.completion, self.schema, self._validator)
            if reason is None:
                fields[i] = value
                continue
            if result.finish_reason == "length":
                reason = f"cut off at its {result.completion_tokens}-token budget (raise task.max_new_tokens); {reason}"
            quoted = result.completion[:_QUOTE_CHARS] + ("..." if len(result.completion) > _QUOTE_CHARS else "")
            status[i], error[i] = INVALID_OUTPUT, f"{reason}; completion: {quoted!r}"
        return [pa.array(fields, self.fields_type)]


register_task(ExtractTaskConfig, ExtractTask, job=EndpointJob())
