"""The search runs without the GIL, reports progress from the calling thread and stops on
Ctrl-C (KeyboardInterrupt) promptly, even a search of over 100k candidates."""

import os
import signal
import threading
import time

import parsim
import pytest

# 150k candidates at 256 GPUs (every schedule, every candidate simulated): many seconds of work.
BIG = {
    "model": {"preset": "llama3-70b"},
    "cluster": {"num_gpus": 256},
    "training": {"global_batch_size": 1024},
}
BIG_OPTIONS = dict(mbs_max=8, all_schedules=True, exhaustive=True)


def test_progress_is_reported_in_order_on_the_calling_thread():
    calls = []
    caller = threading.get_ident()

    def progress(done, total):
        assert threading.get_ident() == caller
        calls.append((done, total))

    result = parsim.search({"cluster": {"num_gpus": 64}}, mbs_max=8, progress=progress)
    assert calls, "no progress reported"
    dones = [d for d, _ in calls]
    assert dones == sorted(dones)
    assert all(0 <= d <= t for d, t in calls)
    # Successive calls differ: the callback is not called when nothing moved.
    assert len(set(calls)) == len(calls)
    assert not result["interrupted"]


def test_an_exception_in_the_callback_stops_the_search_and_is_raised():
    class Stop(Exception):
        pass

    seen = []

    def progress(done, total):
        seen.append(total)
        raise Stop

    started = time.monotonic()
    with pytest.raises(Stop):
        parsim.search(BIG, progress=progress, **BIG_OPTIONS)
    assert len(seen) == 1
    assert time.monotonic() - started < 10


def test_ctrl_c_interrupts_a_search_of_over_100k_candidates():
    totals = []
    sent = []

    def interrupt():
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    # Seen here: with the suite started as a background job of a script (as a CI runner may
    # start it), SIGINT raised nothing and the search ran to its end (61 s), though Python's
    # handler was in place; installed afresh, as a terminal's Python has it, the same run
    # raises. Install it for this test only, so the test does not depend on its launcher.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.0, interrupt)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            parsim.search(BIG, progress=lambda d, t: totals.append(t), **BIG_OPTIONS)
        raised = time.monotonic()
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert sent, "the search ended before the signal: it is too small for this test"
    assert max(totals) >= 100_000
    assert raised - sent[0] < 3.0, f"KeyboardInterrupt {raised - sent[0]:.2f} s after SIGINT"


def test_the_gil_is_released_while_searching():
    ticks = []
    stop = threading.Event()

    def count():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    started = time.monotonic()
    try:
        parsim.search({"cluster": {"num_gpus": 64}}, mbs_max=8)
    finally:
        stop.set()
        t.join()
    elapsed = time.monotonic() - started
    # A thread starved of the GIL would tick about once per 100 ms poll at most.
    assert len(ticks) > 10 * max(elapsed, 0.1) * 2, (len(ticks), elapsed)
