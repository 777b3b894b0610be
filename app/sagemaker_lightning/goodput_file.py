"""goodput.json beside the checkpoints: the records of a job's attempts as far as each got (goodput.py), so that an
attempt after a kill knows the time the killed ones spent since the last save. Bookkeeping, never a reason to end
training: it is written from a thread of its own (an S3 put holds no step), one write at a time, and a write that
fails (S3's SlowDown, a full disk) is one line, said once, the file written again at the next interval. Whoever can
write the checkpoint location can plant the file, and a checkpoint's records: each figure is checked when read
(`checked`), and records that are not the runtime's are ignored in one line naming where they came from. No torch.

    python -c "from sagemaker_lightning import goodput_file as f; f.write('/tmp', []); print(f.read('/tmp'))"
"""

import concurrent.futures
import json
import threading

from sagemaker_lightning.lines import say

NAME = "goodput.json"
EVERY_S = 30.0  # between its writes: an attempt killed after its last save loses at most this much
STARTING_EVERY_S = 5.0  # between its writes while an attempt starts (no step to hold): a long restore killed loses this
# above any figure of a record (seconds: 31,000 years; steps): a larger one is no record's, and an integer too large
# for a float would fail the sums
MOST = 1e12


def path(folder: str) -> str:
    return f"{folder.rstrip('/')}/{NAME}"


def write(folder: str, records: list[dict]) -> None:
    """NAME in `folder`, whole or not at all."""
    from sagemaker_lightning.checkpoints import atomic

    atomic.write(path(folder), json.dumps({"records": records}).encode())


def problem(records) -> str | None:
    """Why `records` are not attempts' records as goodput.py writes them, or None: a list of objects whose figures
    (wall, steps_again, step, each term's seconds) are numbers from 0 to MOST."""
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        return "not a list of records"
    for record in records:
        seconds = record.get("seconds", {})
        if not isinstance(seconds, dict):
            return "seconds is not an object"
        for name, figure in [*((k, record.get(k, 0)) for k in ("wall", "steps_again", "step")), *seconds.items()]:
            if type(figure) not in (int, float) or not 0 <= figure <= MOST:  # NaN too: no comparison holds
                return f"{name} is {json.dumps(figure)[:40]}"
    return None


def checked(records, source: str) -> list[dict] | None:
    """`records`, or None (none known) with one line naming `source` and what is wrong with them."""
    if (why := problem(records)) is None:
        return records
    say(f"ignored {source}: not goodput's records as the runtime writes them ({why}); goodput goes on without them")
    return None


def read(folder: str | None) -> list[dict] | None:
    """The records NAME holds in `folder`, checked; None where there is none."""
    if not folder:
        return None
    import fsspec

    try:
        with fsspec.open(path(folder), "r") as f:
            text = f.read()
    except OSError:  # none written yet, or none readable: as none
        return None
    try:
        found = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: arrays nested deeper than the parser goes
        found = None
    return checked(found.get("records") if isinstance(found, dict) else found, f"goodput's ledger {path(folder)}")


class Writes:
    """The file's writes, each from a thread of its own that ends with it (no thread outlives a trainer, whatever
    ends its fit): while one is in flight a later one is not asked for (the next interval's writes the newer
    records); a failure is said in the training thread (`quiet` elsewhere), where a line cannot land inside a
    project's print(). The training thread and goodput's start-up writes share it: one write in flight at a time."""

    def __init__(self):
        self._put = None  # (folder, future) of the write in flight
        self._failed = None  # (folder, error) of the first failure, until said; said once: each interval would again
        self._said = False
        self._lock = threading.Lock()

    def __getstate__(self):  # strategy="ddp_spawn" pickles the callback, before any write: a lock does not pickle
        return {**self.__dict__, "_lock": None}

    def __setstate__(self, state):
        self.__dict__.update(state, _lock=threading.Lock())

    def write(self, folder: str, records: list[dict], quiet: bool = False) -> None:
        """`records` written in the background, unless a write is in flight."""
        with self._lock:
            self._settle(wait=False, quiet=quiet)
            if self._put is None:
                future = concurrent.futures.Future()

                def put() -> None:
                    try:
                        write(folder, records)
                        future.set_result(None)
                    except Exception as e:
                        future.set_exception(e)

                # a daemon: a process that ends leaves a write in flight as its partial file, which no read takes
                threading.Thread(target=put, name="goodput-ledger", daemon=True).start()
                self._put = (folder, future)

    def every(self, seconds: float, folder: str, records) -> threading.Event:
        """records() written at once and every `seconds`, quietly, from a thread of its own until the event it returns
        is set (made here, not in __init__: strategy="ddp_spawn" pickles the callback before)."""
        stop = threading.Event()

        def writes() -> None:
            while not stop.is_set():
                self.write(folder, records(), quiet=True)
                stop.wait(seconds)

        threading.Thread(target=writes, name="goodput-starting", daemon=True).start()
        return stop

    def check(self, wait: bool) -> None:
        """The write in flight, once it is done (waited for when `wait`); a failure said, the first time."""
        with self._lock:
            self._settle(wait, quiet=False)

    def _settle(self, wait: bool, quiet: bool) -> None:
        if self._put is not None and (wait or self._put[1].done()):
            (folder, put), self._put = self._put, None
            if (e := put.exception()) is not None and not (self._said or self._failed):
                self._failed = (folder, e)
        if self._failed and not quiet:
            (folder, e), self._failed, self._said = self._failed, None, True
            say(
                f"could not write goodput's ledger {path(folder)} ({type(e).__name__}: {e}); training goes on and "
                f"the write is retried every {EVERY_S:.0f} s (until one lands, an attempt killed after its last "
                "save leaves its time since that save out of the goodput)"
            )
