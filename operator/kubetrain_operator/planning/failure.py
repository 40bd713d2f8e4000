"""The failure and success policies: what a group's worker states mean for the TrainingJob.

- Success is explicit: under successPolicy AllWorkers every worker's container must exit 0 (a master
  finishing first does not end the job while others still run); under Worker0, worker 0 exiting 0 is
  enough and the other workers are then deleted.
- A failed worker tears down the whole group (DDP cannot continue without a rank). When several workers
  fail together, a non-retryable exit code anywhere wins (it is the root cause; the others usually die of
  PEER_LOST), otherwise the earliest failure is blamed.
- Non-retryable exit codes (failurePolicy) fail the job at once; otherwise the group restarts while
  restarts < maxRestarts, and the next failure fails the job with reason RestartLimitExceeded.
- A disruption is not a failure: when the cluster took a worker of the group away (its pod's
  DisruptionTarget condition: eviction, drain, preemption, lost node), the group restarts from its
  checkpoint without spending maxRestarts, up to runPolicy.maxDisruptionRestarts (unlimited by default).
  In a fixed-size group every other rank dies of the lost peer, often in the same second, so any disrupted
  worker of the attempt makes the group's failure a disruption, unless a non-retryable exit code says the
  job cannot run at all.
- A hang is a failure no exit code reports: with failurePolicy.progressDeadlineSeconds, a running group in
  which a worker made no progress (its heartbeat's stepAt) for longer restarts like a crash, counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from kubetrain_trainer.exit_codes import ExitCode

from kubetrain_operator import api
from kubetrain_operator.planning.observe import Worker, parse_time

Action = Literal["continue", "restart", "fail", "succeed"]


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    message: str
    worker: Worker | None = None
    disruption: bool = False
    """The restart is for a disruption: counted in status.disruptionRestarts, not in restarts."""


def describe_exit_code(code: int) -> str:
    try:
        return ExitCode(code).name.lower().replace("_", " ")
    except ValueError:
        if code > 128:
            return f"killed by signal {code - 128}"
        return "error"


def describe_failure(worker: Worker) -> str:
    """`worker 1 (pod x) exited with code 11 (peer lost)` or `worker 1 (pod x) failed: Evicted: ...`."""
    who = f"worker {worker.index}"
    if worker.pod_name:
        who += f" (pod {worker.pod_name})"
    if worker.exit_code is not None:
        text = f"{who} exited with code {worker.exit_code} ({describe_exit_code(worker.exit_code)})"
        if worker.reason and worker.reason not in ("Error", "Completed"):
            text += f", reason {worker.reason}"
    else:
        text = f"{who} failed: {worker.reason or 'unknown reason'}"
        if worker.message:
            text += f": {worker.message}"
    return text


DISRUPTION_WORDS = {
    "EvictionByEvictionAPI": "was evicted through the Eviction API (a drain or an eviction)",
    "PreemptionByScheduler": "was preempted by the scheduler for a higher-priority pod",
    "DeletionByTaintManager": "was deleted by the taint manager (its node was NotReady or unreachable)",
    "DeletionByPodGC": "was deleted by the pod garbage collector (its node is gone)",
    "TerminationByKubelet": "was terminated by the kubelet (node pressure or shutdown)",
    "JobDeleted": "was deleted (its Job is gone)",
}
"""What each DisruptionTarget reason means, in the words of a status message."""


def describe_disruption(worker: Worker) -> str:
    """`worker 1 (pod x) on node n was evicted through the Eviction API (a drain or an eviction)`; index
    -1 is an elastic group's rendezvous store."""
    who = f"worker {worker.index}" if worker.index >= 0 else "the rendezvous store"
    if worker.pod_name:
        who += f" (pod {worker.pod_name})"
    if worker.node:
        who += f" on node {worker.node}"
    reason = worker.disruption or "DisruptionTarget"
    return f"{who} {DISRUPTION_WORDS.get(reason, f'was disrupted ({reason})')}"


def decide_disruption(spec: api.TrainingJobSpec, worker: Worker, disruptions: int, then: str) -> Decision:
    """Restart for `worker`'s disruption (`then` says how), counted as disruption `disruptions + 1`, or
    fail with DisruptionLimitExceeded once runPolicy.maxDisruptionRestarts are spent."""
    what = describe_disruption(worker)
    limit = spec.run_policy.max_disruption_restarts
    if limit is not None and disruptions >= limit:
        return Decision(
            "fail",
            "DisruptionLimitExceeded",
            f"{what}; the disruption budget is spent ({disruptions} of maxDisruptionRestarts {limit})",
            worker,
        )
    count = f"disruption {disruptions + 1}" + (f" of {limit}" if limit is not None else "")
    return Decision(
        "restart",
        "WorkerDisrupted",
        f"{what}; {then} ({count}, not counted against maxRestarts)",
        worker,
        disruption=True,
    )


def _blame(failed: Sequence[Worker], policy: api.FailurePolicy) -> tuple[Worker, bool]:
    """The worker to name and whether its failure is retryable (a disrupted worker's exit code, often
    the SIGTERM one, is never taken for a verdict on the job)."""
    permanent = [w for w in failed if not w.disruption and not policy.is_retryable(w.exit_code)]
    if permanent:
        return min(permanent, key=lambda w: w.index), False
    # Earliest finish first; workers without a time (Job-level failures) after, lowest index first.
    return min(failed, key=lambda w: (w.finished_at is None, w.finished_at or "", w.index)), True


def counted_restart(
    spec: api.TrainingJobSpec, what: str, restarts: int, *, reason: str, then: str, worker: Worker | None
) -> Decision:
    """Restart (`then` says how) as restart `restarts + 1` of runPolicy.maxRestarts, or fail with
    RestartLimitExceeded once they are spent."""
    limit = spec.run_policy.max_restarts
    if restarts >= limit:
        return Decision(
            "fail",
            "RestartLimitExceeded",
            f"{what}; the restart budget is spent ({restarts} of maxRestarts {limit})",
            worker,
        )
    return Decision("restart", reason, f"{what}; {then} (restart {restarts + 1} of {limit})", worker)


def decide(
    spec: api.TrainingJobSpec, workers: Sequence[Worker], restarts: int, disruptions: int = 0
) -> Decision:
    """What to do with the group of the current attempt, given the failure and success policies and the
    restarts and disruption restarts spent so far."""
    failed = [w for w in workers if w.phase == "failed"]
    if failed:
        worker, retryable = _blame(failed, spec.failure_policy)
        what = describe_failure(worker)
        if not retryable:
            return Decision(
                "fail",
                "NonRetryableExitCode",
                f"{what}: the exit code is non-retryable (failurePolicy)",
                worker,
            )
        disrupted = [w for w in workers if w.disruption]
        if disrupted:
            # The failed ones first (the cause is over), then by index.
            cause = min(disrupted, key=lambda w: (w.phase != "failed", w.index))
            return decide_disruption(
                spec, cause, disruptions, "restarting the whole group from its checkpoint"
            )
        return counted_restart(
            spec, what, restarts, reason="WorkerFailed", then="restarting the whole group", worker=worker
        )
    if spec.success_policy == "Worker0":
        if workers and workers[0].phase == "succeeded":
            return Decision("succeed", "Worker0Succeeded", "worker 0 succeeded (successPolicy Worker0)")
    elif workers and all(w.phase == "succeeded" for w in workers):
        return Decision("succeed", "AllWorkersSucceeded", f"all {len(workers)} workers succeeded")
    return Decision("continue", "", "")


def last_progress(workers: Sequence[Worker]) -> dict[int, datetime]:
    """When each worker of a running group last made progress: its heartbeat's stepAt, never earlier than
    the moment the whole group ran (the last container start), since no worker can step before all do."""
    starts = [parse_time(w.started_at) for w in workers]
    if not workers or any(w.phase != "running" for w in workers) or None in starts:
        return {}
    group_start = max(t for t in starts if t is not None)
    out = {}
    for w in workers:
        step_at = parse_time(w.step_at)
        out[w.index] = max(step_at, group_start) if step_at is not None else group_start
    return out


def decide_stall(
    spec: api.TrainingJobSpec,
    workers: Sequence[Worker],
    restarts: int,
    now: datetime,
    then: str = "restarting the whole group from its checkpoint",
) -> Decision:
    """Restart (counted; `then` says how) a running group in which a worker made no progress for longer
    than failurePolicy.progressDeadlineSeconds, naming the stalled workers and their last step;
    "continue" when there is no deadline or no stall. An elastic group is judged the same way, once all
    its wanted members run: while one is missing the others may rightly wait in the rendezvous."""
    deadline = spec.failure_policy.progress_deadline_seconds
    if deadline is None:
        return Decision("continue", "", "")
    progress = last_progress(workers)
    idle = {index: (now - at).total_seconds() for index, at in progress.items()}
    stalled = [w for w in workers if idle.get(w.index, 0.0) > deadline]
    if not stalled:
        return Decision("continue", "", "")
    named = "; ".join(
        f"worker {w.index} (pod {w.pod_name}) "
        + (f"at step {w.step}" if w.step is not None else "before its first step")
        + f", {int(idle[w.index])} s ago"
        for w in stalled[:4]
    )
    more = f" and {len(stalled) - 4} more" if len(stalled) > 4 else ""
    what = (
        f"{len(stalled)} of {len(workers)} workers made no progress for over {deadline} s "
        f"(failurePolicy.progressDeadlineSeconds): {named}{more}"
    )
    blamed = dataclasses.replace(stalled[0], reason="ProgressStalled")
    return counted_restart(spec, what, restarts, reason="ProgressStalled", then=then, worker=blamed)


def next_stall_check(spec: api.TrainingJobSpec, workers: Sequence[Worker], now: datetime) -> float | None:
    """Seconds until the first running worker would pass its progress deadline, if nothing moves: a
    frozen worker sends no news, so the planner must look again by then."""
    deadline = spec.failure_policy.progress_deadline_seconds
    progress = last_progress(workers) if deadline is not None else {}
    if not progress:
        return None
    first = min(progress.values())
    return max(1.0, deadline - (now - first).total_seconds() + 1.0)
