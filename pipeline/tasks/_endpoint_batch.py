"""The endpoint backend's batch mode on the executors: request lines out, the provider's answers back in.

A run in ``task.endpoint.mode: batch`` reads its rows twice (``pipeline.stages.batch``):

1. each chunk's rows become their requests (``task.batch_calls``), built by the very code live mode sends
   with (:func:`pipeline.tasks._endpoint.generation_calls`, ``embedding_calls``): one request line per
   row sent, keyed by its request key (:mod:`pipeline.spark.batch_requests`). The driver writes them into
   the run's request files.
2. the key of each row's request again (deterministic: the same row gives the same request), so the
   answers collected from the provider are joined to the rows by key (:data:`pipeline.core.rows.ANSWER_COLUMN`);
   then the task scores the rows as in live mode, with an
   :class:`AnswerClient` in the live client's place: it sends nothing and hands each call the answer its
   key got (or the provider's error, which quarantines the row). Parsing, the schema check of ``extract``,
   statuses, counts and the quarantine are live mode's.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Sequence

import pyarrow as pa

from pipeline.endpoint import Outcome, TokenBudget
from pipeline.endpoint.wire import WireError
from pipeline.core.rows import ANSWER_COLUMN

__all__ = ["AnswerClient", "answer_line", "rows_client"]

# what the scoring pass says of a row whose request the batch answers do not hold (a bug, not the provider)
NO_ANSWER = ("batch API: no answer or error was collected for this row's request; rerun the same command "
             "(its request is submitted then)")


def answer_line(key: str, *, answer: Mapping[str, Any] | None = None, error: str | None = None) -> str:
    """One line of the batch answers (``pipeline.journal.batch_log``): the request key, its answer or error.

    >>> AnswerClient.from_lines([answer_line("k", error="HTTP 400: too long")]).answers["k"]
    {'key': 'k', 'error': 'HTTP 400: too long'}
    """
    entry: dict[str, Any] = {"key": key}
    if answer is not None:
        entry["answer"] = answer
    else:
        entry["error"] = error or "no answer"
    return json.dumps(entry, separators=(",", ":"), ensure_ascii=False)


class AnswerClient:
    """Stands in for :class:`~pipeline.endpoint.EndpointClient` in batch mode: the answers are already there.

    Nothing is sent and nothing paid here: every outcome is marked ``replayed`` (the driver counts what the
    provider billed, from the batches it collected).
    """

    def __init__(self, answers: Mapping[str, Mapping[str, Any]]) -> None:
        self.answers = dict(answers)
        self.budget = TokenBudget(None)
        self._stats: dict[str, float] = {}

    @classmethod
    def from_lines(cls, lines: Sequence[str | None]) -> "AnswerClient":
        """From the answer lines joined to a chunk's rows (None where a row has none)."""
        answers = {}
        for line in lines:
            if line:
                entry = json.loads(line)
                answers[str(entry["key"])] = entry
        return cls(answers)

    @classmethod
    def of_chunk(cls, chunk: pa.RecordBatch) -> "AnswerClient":
        column = chunk.column(chunk.schema.get_field_index(ANSWER_COLUMN)).to_pylist() \
            if ANSWER_COLUMN in chunk.schema.names else []
        return cls.from_lines(column)

    @property
    def stats(self) -> dict[str, float]:
        return dict(self._stats)

    def run(self, calls: Sequence[Any], *, usage: Callable[[Mapping[str, Any]], int],
            on_done: Callable[[int, Outcome], None] | None = None,
            check: Callable[[Mapping[str, Any]], Any] | None = None) -> list[Outcome]:
        """One :class:`~pipeline.endpoint.Outcome` per call, from its key's answer (``check`` as live mode's)."""
        outcomes = []
        for i, call in enumerate(calls):
            outcome = self._outcome(self.answers.get(call.key), check)
            name = "batch_answers" if outcome.ok else "failed_rows"
            self._stats[name] = self._stats.get(name, 0) + 1
            outcomes.append(outcome)
            if on_done is not None:
                on_done(i, outcome)
        return outcomes

    @staticmethod
    def _outcome(entry: Mapping[str, Any] | None, check: Callable[[Mapping[str, Any]], Any] | None) -> Outcome:
        if entry is None:
            return Outcome(ok=False, error=NO_ANSWER, replayed=True)
        answer = entry.get("answer")
        if not isinstance(answer, Mapping):
            return Outcome(ok=False, error=f"batch API: {entry.get('error') or 'no answer'}", replayed=True)
        if check is not None:
            try:
                check(answer)
            except WireError as exc:
                return Outcome(ok=False, error=f"batch API: HTTP 200 with {exc}", replayed=True)
        return Outcome(ok=True, answer=answer, replayed=True)


def rows_client(task: Any, chunk: pa.RecordBatch) -> Any:
    """What answers a chunk's rows on the endpoint backend: the live client of this task attempt, or in batch
    mode an :class:`AnswerClient` over the answers joined to the chunk."""
    if task.config.endpoint.mode == "batch":
        return AnswerClient.of_chunk(chunk)
    from pipeline.tasks._endpoint import attempt_client

    return attempt_client(task.config.endpoint, task.attempt)
