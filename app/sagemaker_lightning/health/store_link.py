"""The watchdog's connection to the job's TCP store (judge.py). The store's client waits for an answer without a
timeout (torch 2.14: a stopped process of rank 0, which holds the store, holds the caller forever), so each call runs
in a thread of its own (Link) and is given up after the caller's wait (heartbeats.PERIOD_S).

    python -c "from sagemaker_lightning.health import store_link as s; print(s.stored('abort'))"
"""

import threading
from collections.abc import Callable
from datetime import timedelta

PREFIX = "sagemaker_lightning/watchdog"  # the watchdog's keys in the job's store: PREFIX/0, PREFIX/abort (stored())


class Silent(Exception):
    """The store did not answer (in time, or with an error)."""


def stored(name: str) -> str:
    """The key `name` as the store holds it (PrefixStore puts a / between)."""
    return f"{PREFIX}/{name}"


def connect(store: str, wait_s: float):
    """A connection of its own to the job's TCP store at `store` (address:port, the plan's MASTER_ADDR:MASTER_PORT).
    `wait_s` bounds its waits for a key, not for an answer."""
    import torch.distributed as dist

    address, port = store.rsplit(":", 1)
    tcp = dist.TCPStore(address, int(port), is_master=False, timeout=timedelta(seconds=wait_s), wait_for_workers=False)
    return dist.PrefixStore(PREFIX, tcp)


class Link:
    """The watchdog's connection to the store, each call made in a thread of its own: a call that gets no answer
    within `wait_s` raises Silent, and until it returns no other starts (at most one thread waits on a stopped store);
    one that fails drops the connection, and the next connects anew."""

    def __init__(self, connect: Callable, wait_s: float):
        self.connect, self.wait_s = connect, wait_s
        self.store = None
        self.waiting: threading.Thread | None = None  # a call still waiting for its answer

    def call(self, operations: Callable):
        """`operations(store)`'s result, or Silent."""
        if self.waiting and self.waiting.is_alive():
            raise Silent("an earlier call still waits for its answer")
        result: dict = {}

        def work():
            try:
                self.store = self.store or self.connect(self.wait_s)
                result["value"] = operations(self.store)
            except Exception as e:  # noqa: BLE001  any failure of the store is its silence
                self.store, result["error"] = None, e

        self.waiting = threading.Thread(target=work, name="sagemaker-lightning-watchdog-store", daemon=True)
        self.waiting.start()
        self.waiting.join(self.wait_s)
        if self.waiting.is_alive():
            raise Silent(f"no answer within {self.wait_s:g} s")
        if "error" in result:
            raise Silent(f"{type(result['error']).__name__}: {result['error']}")
        return result["value"]
