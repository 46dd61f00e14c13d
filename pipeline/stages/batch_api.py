"""The provider's side of a batch-mode run, on the driver: submit the request files, wait, collect, resubmit.

Everything here goes through the run's batch journal (:class:`pipeline.journal.batch_log.BatchLog`) before
it is acted on, so a driver killed at any point, and the rerun of the same command, pick up where it was:

- :func:`submit`: each journaled request file without a batch is uploaded (the file id journaled at once),
  then its batch created (``creating`` journaled before the create is sent, the batch id at once after).
  A file journaled ``creating`` without a batch id (the driver died in between) is first looked for in
  the provider's listing by the metadata every batch of ours carries, so it is never submitted twice.
  ``run.max_tokens`` refuses a file whose estimate would take this try's submissions past it.
- :func:`wait`: the unfinished batches polled (``batch.poll_s`` doubling to ``batch.max_poll_s`` while
  nothing changes), each collected the moment it ends: its output and error files downloaded and kept.
- :func:`verdicts`: what every submitted request came to (answered, failed for good, or to be submitted
  again: its batch expired, was cancelled or failed, or its line was a 5xx, 429 or timeout);
  :func:`resubmit` puts the last kind, and only those, into new request files (``batch.resubmits`` times).
- :func:`write_answers`: one line per request key (its answer, or the provider's error) for the scoring pass.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from pipeline.endpoint.batch_wire import DONE_STATES, cut_files, read_result, usage_tokens
from pipeline.endpoint.batches import BatchApi
from pipeline.endpoint.config import EndpointConfig
from pipeline.endpoint.wire import WireError, read_embedding, read_generation
from pipeline.errors import TokenBudgetReached
from pipeline.journal.batch_log import BatchFile, BatchLog

__all__ = ["Verdicts", "collect", "resubmit", "submit", "verdicts", "wait", "write_answers"]


@dataclass
class Driver:
    """What the batch API steps of one try share: the journal, the API, this try, how to speak and when to stop."""

    log: BatchLog
    api: BatchApi
    endpoint: EndpointConfig
    path: str
    try_id: str
    say: Callable[[str], None]
    between: Callable[[], None] = lambda: None
    faults: Mapping[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    sleep: Callable[[float], None] = time.sleep

    def metadata(self, batch: BatchFile) -> dict[str, str]:
        """What names a batch of ours in the provider's listing: this run's journal folder and the file."""
        return {"sbi_journal": self.log.folder.name, "sbi_file": batch.name}


def submit(driver: Driver) -> int:
    """Upload and create a batch for every journaled request file that has none yet; how many were created.

    Raises :class:`TokenBudgetReached` before the first file whose estimate would take what this try
    submitted past ``run.max_tokens`` (the files before it stay submitted, journaled for the rerun).
    """
    from pipeline.core import faults

    files = driver.log.files()
    spent = sum(f.estimate for f in files if f.submitted_by == driver.try_id)
    created = 0
    for batch in files:
        if batch.batch_id:
            continue
        if driver.max_tokens is not None and spent + batch.estimate > driver.max_tokens:
            _refuse(driver, batch, spent, [f for f in files if not f.batch_id])
        if not batch.file_id:
            batch.file_id = driver.api.upload(f"{driver.log.folder.name}-{batch.name}.jsonl",
                                              driver.log.request_bytes(batch))
            driver.log.save(batch)
        faults.at_batch_step(driver.faults, "uploaded")
        found = driver.api.find(driver.metadata(batch)) if batch.creating else None
        if found is None:
            batch.creating = True
            driver.log.save(batch)
            found = driver.api.create(batch.file_id, endpoint=driver.path,
                                      window=driver.endpoint.batch.completion_window, metadata=driver.metadata(batch))
            created += 1
        else:
            driver.say(f"batch API: {batch.name} was created before the driver stopped ({found.get('id')}): "
                       "polled, not created again")
        batch.batch_id, batch.submitted_by = str(found["id"]), driver.try_id
        _update(batch, found)
        driver.log.save(batch)
        spent += batch.estimate
        driver.say(f"batch API: {batch.name} submitted as {batch.batch_id} ({batch.requests:,} request(s), round "
                   f"{batch.round}, an estimated {batch.estimate:,} tokens)")
        faults.at_batch_step(driver.faults, "created")
    return created


def _refuse(driver: Driver, batch: BatchFile, spent: int, unsubmitted: list[BatchFile]) -> None:
    rest = sum(f.estimate for f in unsubmitted)
    raise TokenBudgetReached(
        f"run.max_tokens {driver.max_tokens:,} would be passed: {batch.name} ({batch.requests:,} request(s), an "
        f"estimated {batch.estimate:,} tokens) was not submitted, on top of the {spent:,} this try submitted; "
        f"{len(unsubmitted)} request file(s) with an estimated {rest:,} tokens wait. Nothing is committed; every "
        "batch submitted so far is journaled in the staging folder and is collected, not submitted again, by the "
        "same command rerun with a budget for the rest", tokens=0)


def _update(batch: BatchFile, found: Mapping[str, Any]) -> bool:
    """Copy a Batch object's state into ``batch``; whether its status changed."""
    changed = batch.status != found.get("status")
    batch.status = str(found.get("status") or batch.status)
    batch.counts = {k: int(v) for k, v in (found.get("request_counts") or {}).items() if isinstance(v, (int, float))}
    batch.created_at = found.get("created_at") or batch.created_at
    batch.ended_at = next((found[k] for k in ("completed_at", "expired_at", "failed_at", "cancelled_at")
                           if found.get(k)), batch.ended_at)
    batch.output_file_id = found.get("output_file_id") or batch.output_file_id
    batch.error_file_id = found.get("error_file_id") or batch.error_file_id
    errors = (found.get("errors") or {}).get("data") if isinstance(found.get("errors"), Mapping) else None
    if errors:
        batch.errors = "; ".join(str(e.get("message") or e.get("code")) for e in errors if isinstance(e, Mapping))[:500]
    return changed


def wait(driver: Driver, *, max_wait_s: float | None) -> tuple[int, float]:
    """Poll the unfinished batches until every one ended (each collected as it ends) or ``max_wait_s`` passed:
    ``(batches still unfinished, seconds waited)``."""
    cfg = driver.endpoint.batch
    started, delay = time.monotonic(), cfg.poll_s
    while True:
        changed = False
        pending = [b for b in driver.log.files() if b.batch_id and not b.collected]
        for batch in pending:
            if batch.status not in DONE_STATES and _update(batch, driver.api.get(str(batch.batch_id))):
                changed = True
                driver.log.save(batch)
                done = f"{batch.counts.get('completed', 0):,} of {batch.requests:,} answered"
                driver.say(f"batch API: {batch.name} ({batch.batch_id}) {batch.status}, {done}")
            if batch.status in DONE_STATES:
                collect(driver, batch)
        left = sum(1 for b in driver.log.files() if b.batch_id and not b.collected)
        waited = time.monotonic() - started
        if not left or (max_wait_s is not None and waited >= max_wait_s):
            return left, waited
        _nap(driver, delay)
        delay = cfg.poll_s if changed else min(delay * 2, cfg.max_poll_s)


def _nap(driver: Driver, seconds: float) -> None:
    """Sleep ``seconds`` between polls, a second at a time: a SIGTERM stops the run within a second (the
    batches stay at the provider and in the journal, for the rerun)."""
    end = time.monotonic() + seconds
    while True:
        driver.between()
        left = end - time.monotonic()
        if left <= 0:
            return
        driver.sleep(min(left, 1.0))


def collect(driver: Driver, batch: BatchFile) -> None:
    """Download an ended batch's output and error files into the journal, then mark it collected."""
    for suffix, file_id in (("output", batch.output_file_id), ("errors", batch.error_file_id)):
        with driver.log.result_file(batch, suffix) as sink:
            if file_id:
                driver.api.download(file_id, sink)
    answered = failed = tokens = 0
    for line in driver.log.result_lines(batch):
        result = read_result(line)
        if result.answer is not None:
            answered, tokens = answered + 1, tokens + usage_tokens(result.answer)
        else:
            failed += 1
    batch.answered, batch.failed, batch.tokens = answered, failed, tokens
    batch.collected, batch.collected_by = True, driver.try_id
    driver.log.save(batch)
    driver.say(f"batch API: {batch.name} ({batch.batch_id}) collected: {answered:,} answered, {failed:,} failed"
               + (f" ({batch.errors})" if batch.errors else "") + f", {tokens:,} tokens")


@dataclass
class Verdicts:
    """What every submitted request key came to: its answer (by key: the file that holds it), its last error
    and whether the provider may still answer it, and how many request files held it."""

    answered: dict[str, int] = field(default_factory=dict)
    failed: dict[str, tuple[str, bool]] = field(default_factory=dict)
    submissions: dict[str, int] = field(default_factory=dict)

    def to_resubmit(self, resubmits: int) -> list[str]:
        """The keys without an answer whose failure was the provider's, submitted at most ``resubmits`` times
        again so far."""
        return [k for k, (_, retry) in self.failed.items()
                if retry and k not in self.answered and self.submissions.get(k, 0) <= resubmits]


def _checker(path: str) -> Callable[[Mapping[str, Any]], Any]:
    return read_embedding if path == "/embeddings" else read_generation


def verdicts(log: BatchLog, path: str) -> Verdicts:
    """The :class:`Verdicts` of every collected batch, in submission order (a later answer wins)."""
    check = _checker(path)
    found = Verdicts(submissions=log.submitted_keys())
    for batch in log.files():
        if not batch.collected:
            continue
        seen = set()
        for line in log.result_lines(batch):
            result = read_result(line)
            seen.add(result.key)
            if result.answer is not None:
                try:
                    check(result.answer)
                except WireError as exc:
                    found.failed[result.key] = (f"HTTP 200 with {exc}", True)
                    continue
                found.answered.setdefault(result.key, batch.n)
                found.failed.pop(result.key, None)
            elif result.key not in found.answered:
                found.failed[result.key] = (result.error or "no answer", result.retry)
        why = f"batch {batch.status}" + (f": {batch.errors}" if batch.errors else "") + ", and no result line for it"
        for key in log.keys_of(batch):
            if key not in seen and key not in found.answered:
                found.failed[key] = (why, True)
    return found


def resubmit(log: BatchLog, found: Verdicts, endpoint: EndpointConfig, say: Callable[[str], None]) -> int:
    """New request files for the keys the provider did not answer (and may still), from their request lines;
    how many requests."""
    keys = set(found.to_resubmit(endpoint.batch.resubmits))
    if not keys:
        return 0
    files = log.files()
    lines: list[tuple[str, str, int]] = []
    for batch in files:
        for line in log.request_lines(batch):
            key = json.loads(line)["custom_id"]
            if key in keys:
                estimate = batch.estimate // max(batch.requests, 1)
                lines.append((key, line.rstrip("\n"), estimate))
                keys.discard(key)
    round_ = max((f.round for f in files), default=0) + 1
    for part in cut_files(lines, max_requests=endpoint.batch.max_requests_per_file,
                          max_bytes=endpoint.batch.max_bytes_per_file):
        log.add_file(part, round=round_)
    say(f"batch API: {len(lines):,} request(s) the provider did not answer submitted again (round {round_})")
    return len(lines)


def write_answers(log: BatchLog, found: Verdicts) -> None:
    """``answers/``: each answered key's answer line (from the file that answered it first), then each other
    key's last error, one line per key (:func:`pipeline.tasks._endpoint_batch.answer_line`'s format)."""
    from pipeline.tasks._endpoint_batch import answer_line

    files = [f for f in log.files() if f.collected]
    if log.answers_done(files):
        return
    def answered_in(batch: BatchFile) -> Iterator[str]:
        for line in log.result_lines(batch):
            result = read_result(line)
            if result.answer is not None and found.answered.get(result.key) == batch.n:
                yield answer_line(result.key, answer=result.answer)

    failed = (answer_line(k, error=why) for k, (why, _) in sorted(found.failed.items()) if k not in found.answered)
    log.write_answers([*((f"{b.n:05d}", answered_in(b)) for b in files), ("failed", failed)], files)
