"""Two ranks of a test in fresh processes (forked from the preloaded server: the parent's threads and torch state stay
out, and torch is not imported again), for the unit tests of what crosses a process group: each runs
`target(rank, *args, out)` and puts `(rank, result)` in `out`.

    results = spawned.two_ranks(target, port, timeout_s=120)   # {0: rank 0's result, 1: rank 1's}
"""

import contextlib
import queue
import time

import preloaded


def two_ranks(target, *args, timeout_s: float) -> dict:
    """rank → what `target(rank, *args, out)` put in `out`; a rank that fails fails the test at once (its traceback
    is above), one that hangs within timeout_s."""
    context = preloaded.context()
    out = context.Queue()
    procs = [context.Process(target=target, args=(rank, *args, out)) for rank in range(2)]
    for p in procs:
        p.start()
    deadline, results = time.monotonic() + timeout_s, {}
    try:
        while len(results) < len(procs):
            assert all(p.exitcode in (None, 0) for p in procs), "a rank failed: its traceback is above"
            assert time.monotonic() < deadline, f"no result within {timeout_s} s: a hang"
            with contextlib.suppress(queue.Empty):
                results.update([out.get(timeout=1)])
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
    finally:
        for p in procs:
            p.kill()
    return results
