"""The work queue's guarantees, without a controller: order, one key once, one pass at a time, delays."""

from __future__ import annotations

import threading
import time

import pytest
from kubetrain_operator.runtime import workqueue
from kubetrain_operator.runtime.workqueue import WorkQueue

pytestmark = pytest.mark.unit


def _get_soon(queue: WorkQueue, seconds: float = 0.3) -> tuple[object, bool] | None:
    """`get`, or None if it is still blocked after `seconds` (the queue is then shut down to free it)."""
    taken: list[tuple[object, bool] | None] = []
    thread = threading.Thread(target=lambda: taken.append(queue.get()))
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        queue.shut_down()
        thread.join(5)
        return None
    return taken[0]


def test_urgent_keys_are_taken_before_routine_ones_and_each_key_once() -> None:
    queue = WorkQueue()
    for key in ("old-1", "old-2", "old-1"):
        queue.add(key)
    queue.add("new", urgent=True)
    queue.add("old-2", urgent=True)  # a routine key made urgent moves up, once
    order = [queue.get(), queue.get()]
    for _ in order:
        queue.urgent_done()  # processed: the routine key need not wait (else it waits ROUTINE_MAX_WAIT)
    order.append(queue.get())
    assert order == [("new", True), ("old-2", True), ("old-1", False)]
    assert queue.sizes()["queued"] == 0


def test_the_depth_callback_follows_the_number_of_queued_keys() -> None:
    depths: list[int] = []
    queue = WorkQueue(on_depth=depths.append)
    queue.add("a")
    queue.add("b", urgent=True)
    queue.add("a")  # already queued: no change
    queue.get()
    assert depths == [1, 2, 1]


def test_routine_work_waits_while_urgent_work_is_processed_but_not_forever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue = WorkQueue()
    queue.add("new-job", urgent=True)
    assert queue.get() == ("new-job", True)  # its workers are being created
    queue.add("status-refresh")
    assert queue.busy()
    assert _get_soon(queue) is None  # it waited instead of taking the routine key

    queue = WorkQueue()
    queue.add("new-job", urgent=True)
    queue.get()
    queue.add("status-refresh")
    monkeypatch.setattr(workqueue, "ROUTINE_MAX_WAIT", 0.0)
    assert _get_soon(queue) == ("status-refresh", False)  # waited long enough


def test_routine_work_is_taken_once_the_urgent_work_is_done() -> None:
    queue = WorkQueue()
    queue.add("new-job", urgent=True)
    queue.get()
    queue.add("status-refresh")
    threading.Timer(0.1, queue.urgent_done).start()
    assert _get_soon(queue, 5) == ("status-refresh", False)
    assert not queue.busy()


def test_a_key_asked_for_while_processed_goes_round_once_more_not_once_per_ask() -> None:
    queue = WorkQueue()
    assert queue.claim("job")
    for _ in range(5):
        assert not queue.claim("job")  # another thread: marked dirty
        queue.add("job")  # an event: not queued, marked dirty
    assert queue.sizes()["queued"] == 0
    assert not queue.release("job")  # dirty: one more pass
    assert queue.release("job")  # clean: released
    assert queue.claim("job")


def test_an_abandoned_key_can_be_claimed_again() -> None:
    queue = WorkQueue()
    queue.claim("job")
    queue.abandon("job")
    assert queue.claim("job")


def test_failures_count_in_a_row_until_a_success() -> None:
    queue = WorkQueue()
    assert [queue.failed("job") for _ in range(3)] == [0, 1, 2]
    queue.succeeded("job")
    assert queue.failed("job") == 0
    assert queue.sizes()["failures"] == 1


def test_forgetting_a_key_in_progress_sends_its_pass_round_once_more_and_drops_its_state() -> None:
    queue = WorkQueue()
    queue.claim("job")
    queue.failed("job")
    queue.add_after("job", 60)
    queue.forget("job")
    assert not queue.wakes_up("job")
    assert not queue.release("job")  # round once more, to see that it is gone
    queue.drop("job")
    assert queue.release("job")
    sizes = queue.sizes()
    assert sizes["failures"] == sizes["due"] == sizes["processing"] == 0


def test_one_pending_wake_up_per_key_the_earliest() -> None:
    queue = WorkQueue()
    for delay in (60, 60, 30, 90, 60):
        queue.add_after("demo", delay)
    queue.add_after("other", 5)
    sizes = queue.sizes()
    assert sizes["due"] == 2
    assert sizes["heap"] == 3  # 60, then the earlier 30, and "other"; the later requests were dropped


def test_wake_ups_of_forgotten_keys_do_not_stay_in_the_delay_heap() -> None:
    queue = WorkQueue()
    for index in range(1_000):  # jobs finished with a TTL of a day, then deleted by hand
        queue.add_after(f"job-{index}", 86_400)
        queue.forget(f"job-{index}")
    queue.add_after("alive", 60)
    assert queue.sizes()["heap"] <= workqueue.HEAP_SLACK + 1


def test_due_keys_are_added_by_the_delay_thread_and_it_stops_on_shut_down() -> None:
    queue = WorkQueue()
    timer = threading.Thread(target=queue.run_delays)
    timer.start()
    queue.add_after("later", 3600)
    queue.add_after("soon", 0.05)
    started = time.monotonic()
    assert _get_soon(queue, 5) == ("soon", False)
    assert time.monotonic() - started >= 0.05
    assert queue.wakes_up("later") and not queue.wakes_up("soon")
    queue.shut_down()
    timer.join(5)
    assert not timer.is_alive()
    assert queue.get() is None
