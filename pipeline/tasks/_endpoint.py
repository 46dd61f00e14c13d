"""The ``endpoint`` backend of ``generate``, ``extract`` and ``embed``: rows answered by an OpenAI-compatible server.

What the three kinds share: the driver-side model check (the server lists the
model: :class:`EndpointJob`), what a worker keeps (:class:`LoadedEndpoint`:
nothing heavy, no local model), the client of one task attempt (its journal
and its share of the run's rates and token budget), and the rows' statuses
when there is no local tokenizer: ``skipped_null``, ``skipped_empty`` and
``skipped_no_content`` (only control or format characters and U+FFFD) are
decided on the text; a prompt past the served model's context is the
server's to refuse, and the row gets ``error`` with its answer.

Per row the output carries the server's usage (``prompt_tokens``,
``completion_tokens``; ``n_tokens`` for embed) and the worker counts add up
what this try paid (``endpoint.*``), which the summary and the runs table show.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from pipeline.endpoint import Call, EndpointClient, EndpointConfig, Outcome
from pipeline.endpoint.attempt import Attempt, SendsRows
from pipeline.endpoint.wire import (WireError, chat_body, completion_body, embedding_body, image_parts, read_embedding,
                                    read_generation)
from pipeline.errors import EngineError, ModelError, TokenBudgetReached
from pipeline.core.metrics import WorkerCounts
from pipeline.registry import ModelInfo
from pipeline.core.rows import MALFORMED, MALFORMED_ERROR, Status
from pipeline.tasks._content import carries_content
from pipeline.tasks._generate_rows import as_text, sent_rows, skip_status
from pipeline.tasks.job import TaskJob

if TYPE_CHECKING:
    from pathlib import Path

    import pyarrow as pa

    from pipeline.config import JobConfig

__all__ = ["Attempt", "EndpointBackend", "EndpointJob", "LoadedEndpoint", "attempt_client", "embed_rows",
           "embedding_calls", "generate_rows", "generation_calls", "served_model"]

# upper estimate of a prompt's tokens from its characters (BPE vocabularies average 3.5-4.5 characters a token
# on English; chat templates add a few tokens per message)
_CHARS_PER_TOKEN = 3
_TEMPLATE_TOKENS = 16


@dataclass
class LoadedEndpoint:
    """What a worker keeps for an endpoint task: the settings (the client is per task attempt) and, for
    ``embed`` with labels, the label descriptions' vectors."""

    config: EndpointConfig
    labels: Any = None
    backend: str = "endpoint"
    precision: str = "served"

    @property
    def load_counts(self) -> dict[str, Any]:
        from urllib.parse import urlsplit

        where = urlsplit(self.config.base_url).netloc
        return {"generation_backend": {f"endpoint ({self.config.model} at {where})": 1}}


class EndpointBackend(SendsRows):
    """The endpoint backend of a kind (a mixin before the kind's own base): its rows go to a server when
    ``task.backend`` is ``endpoint``, with no local model to resolve; each attempt is bound by the Spark glue.

    A kind gives :meth:`endpoint_calls` (the request of each row of a chunk that is sent); batch mode writes
    those into its request files (:meth:`batch_calls`), live mode sends them.
    """

    config: Any
    model: Any

    @property
    def journals_requests(self) -> bool:
        return self.config.backend == "endpoint"

    def endpoint_calls(self, chunk: "pa.RecordBatch") -> tuple[list[int], list[Call], np.ndarray, np.ndarray]:
        """``(rows sent, their calls, status, error)`` of ``chunk`` (:func:`generation_calls`,
        :func:`embedding_calls`)."""
        raise NotImplementedError

    def batch_calls(self, chunk: "pa.RecordBatch") -> list[tuple[int, Any]]:
        """``(row, call)`` of each row of ``chunk`` that is sent: what batch mode writes into its request files
        and joins the answers back by (:mod:`pipeline.tasks._endpoint_batch`)."""
        rows, calls, _, _ = self.endpoint_calls(chunk)
        return list(zip(rows, calls))

    def resolve_model_dir(self, path: str) -> "Path | None":
        """The local model folder to load (none on the endpoint backend: the server holds the model)."""
        if self.config.backend == "endpoint":
            return None
        from pipeline.models.loading import resolve_model_path

        return resolve_model_path(path, registry_uri=self.model.registry_uri)


def served_model(config: EndpointConfig) -> dict[str, Any]:
    """The server's entry for ``config.model`` in ``GET /models``; a clear :class:`ModelError` otherwise.

    Called on the driver before any Spark work: an address nobody answers, a key the server refuses
    or a model it does not serve fails the run in seconds.
    """
    import httpx

    from pipeline.endpoint.limits import backoff_delay, retry_after_seconds

    headers = {"Authorization": f"Bearer {config.secret()}"} if config.secret() else {}
    url = f"{config.base_url}/models"
    timeout = httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s)
    for attempt in range(config.max_attempts):  # a busy server's 429 or 5xx is waited out, as for rows
        try:
            response = httpx.get(url, headers=headers, timeout=timeout, trust_env=False)
        except httpx.HTTPError as exc:
            if attempt + 1 < config.max_attempts and not isinstance(exc, httpx.ConnectError):
                time.sleep(backoff_delay(attempt, base=config.backoff_s, cap=config.max_backoff_s))
                continue
            raise ModelError(f"cannot reach the endpoint at {config.base_url} ({type(exc).__name__}: {exc}): check "
                             "task.endpoint.base_url and that the server runs") from None
        if (response.status_code == 429 or response.status_code >= 500) and attempt + 1 < config.max_attempts:
            wait = retry_after_seconds(response.headers)
            time.sleep(min(wait, config.max_retry_after_s) if wait is not None else
                       backoff_delay(attempt, base=config.backoff_s, cap=config.max_backoff_s))
            continue
        break
    if response.status_code in (401, 403):
        raise ModelError(f"the endpoint at {config.base_url} refused the key (HTTP {response.status_code}): check the "
                         "variable task.endpoint.api_key reads")
    if response.status_code != 200:
        raise ModelError(f"GET {url} answered HTTP {response.status_code}: {response.text[:200]!r}; is "
                         f"{config.base_url} an OpenAI-compatible API root (it usually ends in /v1)?")
    try:
        data = response.json().get("data") or []
    except (ValueError, AttributeError):
        data = []
    for entry in data:
        if isinstance(entry, Mapping) and entry.get("id") == config.model:
            return dict(entry)
    served = sorted(str(e.get("id")) for e in data if isinstance(e, Mapping))
    raise ModelError(f"the endpoint at {config.base_url} does not serve model {config.model!r} (it serves "
                     f"{served}); set task.endpoint.model to one of them")


class EndpointJob(TaskJob):
    """The driver-side hooks of a kind with an endpoint backend: on it, the model is the server's, checked there."""

    def model_info(self, config: "JobConfig", task: Any) -> ModelInfo:
        endpoint = getattr(config.task, "endpoint", None)
        if getattr(config.task, "backend", None) != "endpoint" or endpoint is None:
            return super().model_info(config, task)
        import hashlib
        import json

        entry = served_model(endpoint)
        # what names the weights behind the name; not `created`, which a restarted server changes
        identity = {k: entry.get(k) for k in ("id", "root", "parent", "max_model_len", "owned_by")}
        revision = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
        return ModelInfo(config.model.path or "", config.model.name or endpoint.model, revision)


def attempt_client(config: EndpointConfig, attempt: Attempt | None) -> EndpointClient:
    """The client of one task attempt: its journal, the run's token budget and this task's share of the rates."""
    attempt = attempt or Attempt()
    return EndpointClient(config, journal=attempt.journal, max_tokens=attempt.max_tokens,
                          rate_share=attempt.rate_share)


def _finish(counts: WorkerCounts, client: EndpointClient, outcomes: Sequence[Outcome], paid: int) -> None:
    """Merge the client's counters into the task's and stop the run when the budget refused a row."""
    counts.merge({"endpoint": {**client.stats, "tokens_paid": paid}})
    refused = sum(1 for o in outcomes if o.budget)
    if refused:
        spent = client.budget.spent()
        raise TokenBudgetReached(
            f"run.max_tokens {client.budget.limit:,} reached: this try has spent {spent:,} tokens and {refused:,} "
            "row(s) of this task were not sent; nothing is committed. Every answer so far is kept (the request "
            "journal and the staged tasks): rerun the same command, with a budget for the rest, to pay only for "
            "the rows not answered yet")


def generation_calls(task: Any, cols: Mapping[str, list[Any]],
                     malformed: np.ndarray) -> tuple[list[int], list[Call], np.ndarray, np.ndarray]:
    """``(rows sent, their calls, status, error)`` of a generate/extract chunk: the request of each row that
    is sent (live, or in a batch API request file), and the status of each that is not."""
    from pipeline.generation.sampling import row_seed
    from pipeline.tasks._generate_chunk import row_budget

    cfg, endpoint = task.config, task.config.endpoint
    n = len(malformed)
    status = np.full(n, Status.OK, dtype=object)
    error = np.full(n, None, dtype=object)
    system, schema = task.system_prompt(), task.vllm_json_schema()
    build = chat_body if endpoint.api == "chat" else completion_body
    rows, calls = [], []
    for i, values, image in sent_rows(task, cols, malformed, status, error, carries_content):
        try:
            prompt, chars = _user_prompt(cfg, values, image)
            budget = row_budget(cfg, cols, i)
        except (ValueError, KeyError, IndexError) as exc:
            status[i], error[i] = Status.ERROR, str(exc)
            continue
        key = cols[cfg.seed_column][i] if cfg.seed_column else "\x1f".join(map(str, values.values()))
        if image is not None and not cfg.seed_column:
            key = f"{key}\x1f{image.digest}"
        body = build(endpoint.model, prompt, system=system, max_tokens=budget, temperature=cfg.temperature,
                     top_p=cfg.top_p, seed=row_seed(cfg.seed, key), stop=cfg.stop, json_schema=schema)
        estimate = ((chars + len(system or "")) // _CHARS_PER_TOKEN + _TEMPLATE_TOKENS + budget
                    + (image.token_estimate if image is not None else 0))
        rows.append(i)
        calls.append(Call.of(endpoint.api_path(), body, estimate=estimate))
    return rows, calls, status, error


def generate_rows(task: Any, cols: Mapping[str, list[Any]], malformed: np.ndarray, counts: WorkerCounts,
                  client: Any) -> tuple[list[Any], np.ndarray, np.ndarray]:
    """``(results, status, error)`` for a generate/extract chunk on the endpoint backend (results in row order).

    ``client``: an :class:`~pipeline.endpoint.EndpointClient` (live mode), or what replays a batch run's answers
    (:class:`pipeline.tasks._endpoint_batch.AnswerClient`): the rows are parsed and checked the same way."""
    from pipeline.generation.engine import GenerationResult

    rows, calls, status, error = generation_calls(task, cols, malformed)
    results: list[Any] = [None] * len(malformed)

    def usage(answer: Mapping[str, Any]) -> int:
        reply = read_generation(answer)
        return reply.prompt_tokens + reply.completion_tokens

    started = time.perf_counter()
    outcomes = client.run(calls, usage=_safe(usage), on_done=_progress(counts, _safe(usage)), check=read_generation)
    paid = 0
    for i, outcome in zip(rows, outcomes):
        if not outcome.ok:
            status[i], error[i] = Status.ERROR, f"endpoint: {outcome.error}"
            results[i] = GenerationResult("", [], 0, "error", outcome.seconds * 1000.0, error=error[i])
            continue
        try:
            reply = read_generation(outcome.answer or {})
        except WireError as exc:
            status[i], error[i] = Status.ERROR, f"endpoint: {exc}"
            results[i] = GenerationResult("", [], 0, "error", outcome.seconds * 1000.0, error=error[i])
            continue
        if not outcome.replayed:
            paid += reply.prompt_tokens + reply.completion_tokens
        results[i] = GenerationResult(reply.text, [], reply.prompt_tokens, reply.finish_reason,
                                      outcome.seconds * 1000.0, usage_completion_tokens=reply.completion_tokens)
    _count_generation(counts, [results[i] for i in rows], paid, time.perf_counter() - started)
    _finish(counts, client, outcomes, paid)
    return results, status, error


def _user_prompt(config: Any, values: Mapping[str, Any], image: Any) -> tuple[Any, int]:
    """``(the user message's content, its characters)``: the template's text, or with an image its content parts
    (the image where the template names the image column, else first)."""
    if image is None:
        prompt = config.template.format(**values)
        return prompt, len(prompt)
    mark = "\x00image\x00"
    user = config.template.format(**{**values, config.image_column: mark})
    before, marked, after = user.partition(mark)
    if not marked:
        before, after = "", user
    return image_parts(before, image.data_uri(), after), len(before) + len(after)


def _safe(usage: Any) -> Any:
    def tokens(answer: Mapping[str, Any]) -> int:
        try:
            return int(usage(answer))
        except (WireError, TypeError, ValueError):
            return 0
    return tokens


def _progress(counts: WorkerCounts, usage: Any) -> Any:
    def done(_: int, outcome: Outcome) -> None:
        counts.add("progress_rows")
        if outcome.ok and outcome.answer is not None:
            counts.add("progress_tokens", usage(outcome.answer))
        if counts.on_batch is not None:
            counts.on_batch(counts)
    return done


def _count_generation(counts: WorkerCounts, results: Sequence[Any], paid: int, seconds: float) -> None:
    prompt = sum(r.prompt_tokens for r in results if r is not None)
    completion = sum(r.completion_tokens for r in results if r is not None)
    counts.add("prompt_tokens", prompt)
    counts.add("completion_tokens", completion)
    counts.add("tokens", paid)
    counts.add("generate_seconds", seconds)
    if results:
        counts.record_batch(rows=len(results), tokens=prompt + completion, padded_tokens=prompt + completion,
                            seconds=seconds, padded_length=0)


def embedding_calls(task: Any, texts: Sequence[Any],
                    malformed: np.ndarray) -> tuple[list[int], list[Call], np.ndarray, np.ndarray]:
    """``(rows sent, their calls, status, error)`` of an embed chunk (one ``/embeddings`` request per row)."""
    endpoint = task.config.endpoint
    n = len(texts)
    status = np.full(n, Status.OK, dtype=object)
    error = np.full(n, None, dtype=object)
    rows, calls = [], []
    for i, value in enumerate(texts):
        text = as_text(value)
        if malformed[i]:
            status[i], error[i] = MALFORMED, MALFORMED_ERROR
            continue
        skipped = skip_status([text], carries_content)
        if skipped is not None:
            status[i] = skipped
            continue
        rows.append(i)
        calls.append(Call.of("/embeddings", embedding_body(endpoint.model, text),
                             estimate=len(text) // _CHARS_PER_TOKEN + _TEMPLATE_TOKENS))
    return rows, calls, status, error


def embed_rows(task: Any, texts: Sequence[Any], malformed: np.ndarray, counts: WorkerCounts,
               client: Any) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray]:
    """``(embeddings of the ok rows, status, error, n_tokens)`` for an embed chunk on the endpoint backend."""
    n = len(texts)
    rows, calls, status, error = embedding_calls(task, texts, malformed)
    n_tokens = np.zeros(n, dtype=np.int32)
    started = time.perf_counter()
    tokens_of = _safe(lambda a: read_embedding(a)[1])
    outcomes = client.run(calls, usage=tokens_of, on_done=_progress(counts, tokens_of), check=read_embedding)
    vectors: list[list[float] | None] = [None] * n
    paid = 0
    for i, outcome in zip(rows, outcomes):
        try:
            if not outcome.ok:
                raise WireError(str(outcome.error))
            vector, tokens = read_embedding(outcome.answer or {})
        except WireError as exc:
            status[i], error[i] = Status.ERROR, f"endpoint: {exc}"
            continue
        vectors[i], n_tokens[i] = vector, tokens
        paid += 0 if outcome.replayed else tokens
    ok = [i for i in range(n) if vectors[i] is not None]
    dims = {len(vectors[i]) for i in ok}  # type: ignore[arg-type]
    if len(dims) > 1:
        raise EngineError(f"the endpoint returned embeddings of different sizes {sorted(dims)} in one task")
    matrix = np.asarray([vectors[i] for i in ok], dtype=np.float32) if ok else None
    counts.add("tokens", paid)
    counts.add("prompt_tokens", int(n_tokens.sum()))
    if ok:
        counts.record_batch(rows=len(ok), tokens=int(n_tokens.sum()), padded_tokens=int(n_tokens.sum()),
                            seconds=time.perf_counter() - started, padded_length=0)
    _finish(counts, client, outcomes, paid)
    return matrix, status, error, n_tokens
