"""The end-of-run summary: what a run did, as the caller gets it, the console prints it and the runs table stores it.

:class:`RunSummary` is built on the driver (``pipeline.stages.summary``) from
the merged worker counts (:mod:`pipeline.core.metrics`) and the tables read back;
``render()`` is the text printed at the end of a run, ``to_dict()`` /
``to_json()`` what ``run.summary_path`` and the runs table keep. Pure Python:
no pyspark import.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from pipeline.core.run_counts import RunCounts

__all__ = ["RunSummary", "batch_api_line"]


def _counter_fields(cls: type) -> type:
    """``cls``, before :func:`~dataclasses.dataclass` reads it, with one field after its own per summary field the
    run's counters fill (:meth:`RunCounts.summary_types`), typed as they fill it and empty by default (as
    :meth:`RunCounts.summary_fields` of no counts): the counters declare these fields, once, not the summary."""
    empty = RunCounts().summary_fields()
    for name, declared in RunCounts.summary_types().items():
        if name in cls.__annotations__:
            raise TypeError(f"{cls.__name__}.{name} is filled by the counters (RunCounts' summary=); "
                            "drop its declaration")
        cls.__annotations__[name] = declared
        setattr(cls, name, field(default_factory=dict) if isinstance(empty[name], dict) else empty[name])
    return cls


@dataclass
@_counter_fields
class RunSummary:
    """What a run did, printed at the end and returned to the caller.

    The fields below are the run's facts; after them come the fields its counters fill (``status``, ``tokens``,
    ``model_loads``, ``retries``, ...), declared by :class:`~pipeline.core.run_counts.RunCounts`' ``summary=`` and
    filled by :meth:`~pipeline.core.run_counts.RunCounts.summary_fields`.
    """

    job: str
    run_id: str
    ds: str
    rows_in: int
    rows_out: int
    seconds: float
    model_name: str
    model_revision: str
    output: str
    delta_version: int | None
    writer: str
    samples: list[dict[str, Any]] = field(default_factory=list)
    rows_quarantined: int = 0
    quarantine: str | None = None
    incremental: bool = False
    # what does not add up (the task kind's completeness check), None when every input row is accounted for
    incomplete: str | None = None
    # set when this run's committed rows are no longer in the latest snapshot, e.g. "replaced by run b (version 3)"
    replaced: str | None = None
    # task-specific summary lines, {label: value} (e.g. the recommend kind's latest table and model quality)
    details: dict[str, str] = field(default_factory=dict)
    # inference tasks the runner planned
    tasks: int = 0
    # per-batch metrics (see batch_metrics): length histogram, worker timelines, slowest batches,
    # and for generation finish reasons and token counts
    batch_metrics: dict[str, Any] = field(default_factory=dict)
    # wall seconds of the driver's stages (session, model check, pre-flight, ..., commit, read-back), in order:
    # what a small job spends outside inference (StageClock)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    # a rerun of a killed run: the rows scored by this try (against the counters' resumed_tasks and rows_reused);
    # resume_note: why staged output was not reused, or why there is none
    rows_scored: int = 0
    resume_note: str | None = None
    # what identified the source's content (``delta:<table id>:<version>``, ``files:<hash>``), and why it
    # is a new input although its version looks the same (a table dropped and rebuilt)
    source_snapshot: str | None = None
    source_note: str | None = None
    # what the run ran with: this library, Python, pyspark, torch, transformers (pipeline.core.compat.runtime_versions)
    versions: dict[str, str] = field(default_factory=dict)
    # a streaming job's run: the trigger, the checkpoint, the query id, its micro-batches (how many, the first
    # and last batch id, those an earlier try had committed) and the source offsets it read (start, end)
    stream: dict[str, Any] = field(default_factory=dict)
    # the output's profile and its drift verdict against the job's recent runs ({"profile": ..., "drift": ...},
    # pipeline.core.sketches and pipeline.core.drift); empty when run.quality is off
    quality: dict[str, Any] = field(default_factory=dict)
    # a served model in batch mode: the batches (file, id, state, round, requests, answered, failed, tokens), their
    # states, the requests (first submitted and submitted again), the tokens this try collected, how long it
    # waited and how long the provider took; ``pending``/``pending_reason`` when the run ended before they did
    batch_api: dict[str, Any] = field(default_factory=dict)

    @property
    def rows_flagged(self) -> int:
        return sum(n for s, n in self.status.items() if s != "ok")

    @property
    def docs_per_s(self) -> float:
        return self.rows_out / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def padding_efficiency(self) -> float:
        return self.tokens / self.padded_tokens if self.padded_tokens else 1.0

    @property
    def complete(self) -> bool:
        """Every input row is in the output or the quarantine table, once (as the task kind checks it)."""
        return self.incomplete is None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            rows_flagged=self.rows_flagged,
            docs_per_s=round(self.docs_per_s, 2),
            tokens_per_s=round(self.tokens_per_s, 2),
            padding_efficiency=round(self.padding_efficiency, 4),
            complete=self.complete,
        )
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def render(self) -> str:
        """A human-readable end-of-run report."""
        loads = self.model_loads
        load_line = (
            f"{sum(loads.values())} load(s) in {len(loads)} worker(s); "
            f"max {max(loads.values())} per worker" if loads else
            "none (every task reused from an earlier try)" if self.resumed_tasks else "none (no rows reached a worker)"
        )
        status = ", ".join(f"{k}={v}" for k, v in sorted(self.status.items())) or "-"
        check = "OK: every input row written once" if self.complete else f"MISMATCH: {self.incomplete}"
        lines = [
            f"== {self.job} run {self.run_id} (ds {self.ds}) ==",
            f"rows in / out / flagged : {self.rows_in:,} / {self.rows_out:,} / {self.rows_flagged:,}"
            + (f" / quarantined {self.rows_quarantined:,}" if self.rows_quarantined else "")
            + f"   [{check}]" + ("  (incremental: new or changed rows only)" if self.incremental else ""),
            f"row status              : {status}",
            f"time                    : {self.seconds:,.1f} s",
            f"throughput              : {_rate(self.docs_per_s)} docs/s"
            + (f", {self.tokens_per_s:,.0f} tokens/s" if self.tokens else ""),
        ]
        if self.padded_tokens:  # tasks without tokens (image classification) pad nothing
            lines.append(f"padding efficiency      : {self.padding_efficiency:.3f} ({self.tokens:,} real / "
                         f"{self.padded_tokens:,} padded tokens in {self.batches:,} batches)")
        lines += [
            f"model                   : {self.model_name} @ {self.model_revision}",
            f"model loads             : {load_line}",
        ]
        if self.rows_per_worker:
            lines.append(f"rows per worker         : {_spread(self.rows_per_worker)} in {self.tasks:,} task(s)")
        if self.load_seconds or self.infer_seconds:
            lines.append(f"worker time             : model load {self.load_seconds:,.1f} s, inference "
                         f"{self.infer_seconds:,.1f} s" + (f", output profile {self.profile_seconds:,.2f} s"
                                                          if self.profile_seconds else "") + " (summed over workers)")
        if self.precision_used:
            used = ", ".join(f"{p} x{n}" for p, n in sorted(self.precision_used.items()))
            lines.append(f"precision               : {used} (model loads)")
        for choice, n in sorted(self.precision_auto.items()):
            lines.append(f"precision auto          : {choice} in {n} load(s)")
        for check, n in sorted(self.precision_checks.items()):
            lines.append(f"precision gate          : {check} in {n} load(s)")
        for reason, n in sorted(self.precision_fallbacks.items()):
            lines.append(f"precision fallback      : {reason} in {n} load(s)")
        if self.generation_backend:
            used = ", ".join(f"{b} x{n}" for b, n in sorted(self.generation_backend.items()))
            lines.append(f"generation backend      : {used} (model loads)")
        lines += [f"{label:<24}: {value}" for label, value in self.details.items()]
        if self.endpoint:
            lines.append(f"endpoint                : {_endpoint_line(self.endpoint)}")
        if self.batch_api:
            lines.append(f"batch API               : {batch_api_line(self.batch_api)}")
        if self.prompt_tokens or self.completion_tokens:
            lines.append(f"token usage             : {self.prompt_tokens + self.completion_tokens:,} "
                         f"({self.prompt_tokens:,} prompt + {self.completion_tokens:,} completion) over the rows"
                         + (f"; this try paid {int(self.endpoint.get('tokens_paid', 0)):,}" if self.endpoint else ""))
        lines.append(f"output                  : {self.output} (Delta version {self.delta_version}, {self.writer} writer)")
        # the lines a run has only when it has their facts (None: no line), the label padded as above
        stages = ", ".join(f"{name} {s:,.1f} s" for name, s in self.stage_seconds.items() if s >= 0.05)
        lines += [f"{label:<24}: {text}" for label, text in (
            ("since then", f"{self.replaced} (this run's commit landed and was checked at version "
                           f"{self.delta_version})" if self.replaced else None),
            ("quarantine", f"{self.quarantine} ({self.rows_quarantined:,} rows of this run)" if self.quarantine
             else None),
            ("versions", ", ".join(f"{k} {v}" for k, v in self.versions.items()) if self.versions else None),
            ("driver stages", stages if self.stage_seconds else None),
            ("resumed", f"{self.resumed_tasks:,} of {self.tasks:,} task(s) from an earlier try; rows reused "
                        f"{self.rows_reused:,}, scored {self.rows_scored:,}" if self.resumed_tasks else None),
            ("not resumed", self.resume_note or None),
            ("source", self.source_note or None),
            ("stream", _stream_line(self.stream) if self.stream else None),
            ("batch retries", ", ".join(f"{k}={v}" for k, v in self.retries.items()) if self.retries else None),
        ) if text is not None]
        lines += _quality_lines(self.quality)
        for row in self.samples:
            lines.append("sample                  : " + _short(row))
        return "\n".join(lines)


def _stream_line(facts: Mapping[str, Any]) -> str:
    """One line for a streaming run's micro-batches and what they read.

    >>> _stream_line({"trigger": "available_now", "micro_batches": 3, "batch_ids": [4, 6], "replayed": [4],
    ...               "sources": [{"start_offset": {"version": 3}, "end_offset": {"version": 9}}]})
    '3 micro-batch(es) 4-6 (available_now), read {"version": 3} -> {"version": 9}; 1 committed by an earlier try: 4'
    """
    ids = facts.get("batch_ids") or []
    text = f"{facts.get('micro_batches', 0)} micro-batch(es)" + (f" {ids[0]}-{ids[1]}" if ids else "")
    text += f" ({facts.get('trigger')})"
    for source in facts.get("sources") or []:
        start, end = (json.dumps(source.get(k)) if isinstance(source.get(k), dict) else str(source.get(k))
                      for k in ("start_offset", "end_offset"))
        text += f", read {start} -> {end}"
    if facts.get("replayed"):
        text += (f"; {len(facts['replayed'])} committed by an earlier try: "
                 + ", ".join(str(b) for b in facts["replayed"]))
    return text


def _quality_lines(quality: Mapping[str, Any]) -> list[str]:
    """The drift gate's verdict: one line, then one per measure that moved.

    >>> drift = {"findings": [{"measure": "status", "test": "PSI", "value": 2.1, "limit": 0.25, "p_value": 0.0,
    ...          "change": "skipped_empty 0.0% -> 33.3%", "flagged": True}], "history": ["a", "b"], "action": "warned"}
    >>> print("\\n".join(_quality_lines({"drift": drift})))
    quality                 : 1 of 1 measure(s) against the last 2 run(s) moved (warned: published)
    drift                   : status: PSI 2.1 > 0.25 (p < 1e-12): skipped_empty 0.0% -> 33.3%
    """
    if not quality.get("drift"):
        return []
    from pipeline.core.drift import Verdict

    verdict = Verdict.from_dict(quality["drift"])
    action = {"warned": " (warned: published)", "accepted": " (accepted with --accept-drift: published)",
              "refused": " (refused: nothing published)"}.get(verdict.action, "")
    return ([f"quality                 : {verdict.headline()}{action}"]
            + [f"drift                   : {f.line()}" for f in verdict.measures_moved()])


def batch_api_line(facts: Mapping[str, Any]) -> str:
    """One line for what a run's batches did at the provider (the summary's and the report's).

    >>> line = batch_api_line({"batches": [{}, {}], "states": {"completed": 1, "expired": 1}, "requests": 20,
    ...                        "resubmitted": 4, "answered": 19, "failed": 5, "tokens": 4200, "waited_s": 81.5,
    ...                        "provider_s": 80.0, "pending": 0})
    >>> print(*line.split("; "), sep="\\n")
    2 batch(es) (completed x1, expired x1): 20 request(s), 4 submitted again
    19 answered, 5 failed
    4,200 tokens collected by this try
    waited 81.5 s (the provider took 80.0 s)
    """
    states = ", ".join(f"{k} x{v}" for k, v in sorted((facts.get("states") or {}).items()))
    text = (f"{len(facts.get('batches') or []):,} batch(es) ({states or 'none'}): "
            f"{int(facts.get('requests', 0)):,} request(s)")
    if facts.get("resubmitted"):
        text += f", {int(facts['resubmitted']):,} submitted again"
    text += f"; {int(facts.get('answered', 0)):,} answered, {int(facts.get('failed', 0)):,} failed"
    text += f"; {int(facts.get('tokens', 0)):,} tokens collected by this try; waited {facts.get('waited_s', 0):,} s"
    if facts.get("provider_s") is not None:
        text += f" (the provider took {facts['provider_s']:,} s)"
    if facts.get("pending_reason"):
        text += f"; {int(facts.get('pending', 0)):,} pending: {facts['pending_reason']}"
    return text


def _endpoint_line(stats: Mapping[str, float]) -> str:
    """One line for what a run's requests to a server did.

    >>> _endpoint_line({"requests": 12, "retry_429": 2, "retry_5xx": 1, "replayed": 3, "lost_answers": 0})
    '12 request(s) sent, 3 retried (429 x2, 5xx x1), 3 answer(s) replayed from the journal, 0 lost answer(s)'
    """
    causes = {"429": "retry_429", "5xx": "retry_5xx", "timeout": "retry_timeout", "connection": "retry_connection",
              "bad body": "retry_bad_body", "other": "retry_other"}
    retried = {name: int(stats.get(key, 0)) for name, key in causes.items() if stats.get(key)}
    if "batch_answers" in stats and not stats.get("requests"):  # batch mode: the workers sent nothing
        text = f"{int(stats['batch_answers']):,} row(s) answered from the batch API"
        return text + (f", {int(stats['failed_rows']):,} row(s) failed" if stats.get("failed_rows") else "")
    text = f"{int(stats.get('requests', 0)):,} request(s) sent"
    if retried:
        text += f", {sum(retried.values()):,} retried (" + ", ".join(f"{k} x{v}" for k, v in retried.items()) + ")"
    text += f", {int(stats.get('replayed', 0)):,} answer(s) replayed from the journal"
    text += f", {int(stats.get('lost_answers', 0)):,} lost answer(s)"
    if stats.get("failed_rows"):
        text += f", {int(stats['failed_rows']):,} row(s) failed"
    return text



def _spread(per_worker: Mapping[str, int]) -> str:
    """``'20,100 / 19,900 (2 workers, min/max 0.99)'``: how evenly the workers shared the rows.

    >>> _spread({"h:1": 19_900, "h:2": 20_100})
    '20,100 / 19,900 (2 workers, min/max 0.99)'
    """
    counts = sorted(per_worker.values(), reverse=True)
    shown = " / ".join(f"{n:,}" for n in counts[:8]) + (" / ..." if len(counts) > 8 else "")
    ratio = counts[-1] / counts[0] if counts[0] else 1.0
    return f"{shown} ({len(counts)} worker{'s' if len(counts) != 1 else ''}, min/max {ratio:.2f})"


def _short(row: Mapping[str, Any], width: int = 160) -> str:
    parts = []
    for key, value in row.items():
        if isinstance(value, float):
            value = round(value, 4)
        elif isinstance(value, (list, tuple)) and len(value) > 4:
            value = f"[{len(value)} values]"
        elif isinstance(value, dict):
            value = {k: round(v, 3) if isinstance(v, float) else v for k, v in value.items()}
        text = str(value)
        parts.append(f"{key}={text[:60] + '…' if len(text) > 60 else text}")
    line = " ".join(parts)
    return line if len(line) <= width else line[: width - 1] + "…"



def _rate(per_s: float) -> str:
    """A rate with its digits: ``1,234.5``, ``3.2``, and ``0.032`` for a slow task (not ``0.0``).

    >>> _rate(1234.5), _rate(3.21), _rate(0.0318), _rate(0.0)
    ('1,234.5', '3.2', '0.032', '0.0')
    """
    return f"{per_s:,.1f}" if per_s >= 1 or per_s == 0 else f"{per_s:.2g}"
