"""The retry decision: what one delivery attempt's outcome means for its task.

``decide(task, outcome, queue, now, rng)`` is pure (no journal, scheduler, clock or
global random inside), so every rule of the retry policy (what counts as success,
when a task is out of attempts or of time, how long to back off, when to honour
``Retry-After``) is unit-tested with a fixed clock and rng; the engine only carries
the decision out (journal, scheduler, the sibling hooks, callbacks).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from miyamoto.config.settings import QueueConfig
from miyamoto.delivery.attempt import Outcome
from miyamoto.delivery.backoff import Rng, backoff, jittered, retry_after
from miyamoto.tasks import options
from miyamoto.tasks.task import State, Task, add_attempt


class Action(enum.Enum):
    SUCCEEDED = "succeeded"  # a 2xx: end the task, tell the siblings, run its callback
    RETRY = "retry"  # a failed attempt with attempts and time left: fire again at ``at``
    FAILED = "failed"  # out of attempts or of retry time: end it in the dead-letter list
    EXPIRED = "expired"  # a failed attempt whose retry would start after the task's
    #                      expires_at: end it as expired (told like a failure)
    ACCEPTED = "accepted"  # a long task's 202: it stays running, its lease timed, until
    #                        the worker reports at the completion URL or the lease runs out
    RECORD = "record"  # the copy ended (cancel, a sibling's news) while the attempt ran:
    #                    only the attempt is recorded, the end stands and nobody is told


@dataclass(frozen=True)
class Decision:
    """The action and the task's record after the attempt (what the journal keeps)."""

    action: Action
    task: Task

    @property
    def retry_at(self) -> float | None:
        """When a retried task fires next; None for any other action."""
        return self.task.fire_at if self.action is Action.RETRY else None


ACCEPTED_STATUS = 202


def is_success(status: int | None) -> bool:
    """Success is a 2xx; a redirect, any other status or no response is a failed attempt."""
    return status is not None and 200 <= status < 300


def exhausted(attempts: int, task: Task, queue: QueueConfig, now: float) -> bool:
    """Out of attempts (the task's own max_attempts, else the queue's) or out of time
    (``max_retry_duration`` since the first attempt, when the queue sets one)."""
    if attempts >= (task.max_attempts or queue.max_attempts):
        return True
    return bool(queue.max_retry_duration and task.first_attempt is not None
                and now - task.first_attempt >= queue.max_retry_duration)


def retry_delay(attempts: int, outcome: Outcome, queue: QueueConfig, now: float,
                rng: Rng, task: Task | None = None) -> float:
    """Seconds until the next attempt: the worker's ``Retry-After`` when it sent one
    (capped at max_backoff), else the task's own ``retry_delays``, else the backoff
    formula with +/-10% jitter, so that tasks failing together do not all come back
    in the same instant."""
    asked = retry_after(outcome.retry_after(), now, queue.max_backoff)
    if asked is not None:
        return asked
    if task is not None and task.retry_delays:  # the task's own delays, as given: no jitter
        return options.next_delay(task.retry_delays, attempts)
    return jittered(backoff(attempts, queue), rng)


def decide(task: Task, outcome: Outcome, queue: QueueConfig, now: float,
           rng: Rng) -> Decision:
    """What to do with ``task`` after the attempt that produced ``outcome`` at ``now``.
    A task with a lease whose worker answers 202 is accepted: running until its worker
    reports (``reported``) or ``fire_at``, the lease's end; any other task's 202 is a
    success, as it always was."""
    attempts = task.attempts + 1
    counted = {"attempts": attempts,
               "executions": task.executions + (outcome.status is not None),
               "last": outcome.record(),
               "history": add_attempt(task.history, outcome.attempt())}
    if task.state.ended:
        return Decision(Action.RECORD, task.evolve(finished=task.finished or now, **counted))
    if task.lease is not None and outcome.status == ACCEPTED_STATUS:
        return Decision(Action.ACCEPTED, task.evolve(state=State.RUNNING, accepted=attempts,
                                                     fire_at=now + task.lease, **counted))
    return _settle(task, is_success(outcome.status), outcome, queue, now, rng, counted)


def reported(task: Task, outcome: Outcome, queue: QueueConfig, now: float,
             rng: Rng, delay: float | None = None) -> Decision:
    """The end of a long task's accepted attempt (or a pull queue's lease): its worker's
    report (``outcome.ok``: succeeded) or its lease run out (a failed attempt, retried
    like any other; ``delay``: a nack's own wait before the retry, instead of the
    backoff). The attempt was counted when it was accepted; only its last response
    changes here."""
    counted = {"last": outcome.record(), "accepted": 0}
    if task.state.ended:
        return Decision(Action.RECORD, task.evolve(finished=task.finished or now, **counted))
    return _settle(task, outcome.ok, outcome, queue, now, rng, counted, delay)


def _settle(task: Task, ok: bool, outcome: Outcome, queue: QueueConfig, now: float,
            rng: Rng, counted: dict, delay: float | None = None) -> Decision:
    attempts = counted.get("attempts", task.attempts)
    if ok:
        return Decision(Action.SUCCEEDED,
                        task.evolve(state=State.SUCCEEDED, finished=now, **counted))
    if exhausted(attempts, task, queue, now):
        return Decision(Action.FAILED, task.evolve(state=State.FAILED, finished=now, **counted))
    at = now + (retry_delay(attempts, outcome, queue, now, rng, task) if delay is None
                else delay)
    if task.expires_at is not None and at >= task.expires_at:
        return Decision(Action.EXPIRED, task.evolve(state=State.EXPIRED, finished=now, **counted))
    return Decision(Action.RETRY, task.evolve(state=State.SCHEDULED, fire_at=at, **counted))
