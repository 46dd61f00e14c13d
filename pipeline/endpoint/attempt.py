"""What a task whose rows go to a server gets for each task attempt, and the capability that says it sends them.

A kind with an ``endpoint`` backend (``generate``, ``extract``, ``embed``) derives from :class:`SendsRows`;
whether one task sends its rows is :func:`journals_requests` (its config chose the endpoint backend). The
Spark glue (:mod:`pipeline.spark.udf`) then binds each attempt's request journal, the run's token budget and
the task's share of the rates (:meth:`SendsRows.bind_attempt`), and the run refuses to start without a
staging folder for the journal (:mod:`pipeline.stages.planning`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Attempt", "SendsRows", "journals_requests"]


@dataclass
class Attempt:
    """What the Spark glue gives an endpoint task for one attempt: its journal, the budget, its rate share."""

    journal: Any = None
    max_tokens: int | None = None
    rate_share: float = 1.0


class SendsRows:
    """The capability of a task kind that may send its rows to a server; a subclass says when it does."""

    attempt: Attempt | None = None

    @property
    def journals_requests(self) -> bool:
        """Whether rows go to a server (the Spark glue then binds each attempt: :meth:`bind_attempt`)."""
        return False

    def bind_attempt(self, journal: Any, *, max_tokens: int | None, rate_share: float) -> None:
        """This attempt's request journal, the run's token budget and this task's share of the rates."""
        self.attempt = Attempt(journal=journal, max_tokens=max_tokens, rate_share=rate_share)


def journals_requests(task: Any) -> bool:
    """Whether ``task`` sends its rows to a server (and journals every answer in the run's staging folder).

    >>> journals_requests(object()), journals_requests(SendsRows())
    (False, False)
    """
    return isinstance(task, SendsRows) and task.journals_requests
