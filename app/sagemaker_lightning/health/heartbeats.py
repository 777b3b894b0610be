"""What a heartbeat of the watchdog (judge.py) says, and the line made of them: each rank's heartbeat, the busy mark
and the abort line in the job's TCP store, read through Reader, which ignores a value that is not this job's
(signing.py) and one that does not parse.

    python -c "from sagemaker_lightning.health import heartbeats as h; print(h.named(None))"
"""

import json
import os
import traceback
from collections.abc import Mapping

from sagemaker_lightning.health.signing import Forged, opened
from sagemaker_lightning.health.store_link import stored
from sagemaker_lightning.lines import say

PERIOD_S = 2.0  # between heartbeats, and the longest wait for the store: a hang is named this long after its timeout
STALE_PERIODS = 3  # a heartbeat older than this many periods: the process stopped answering
ABORT = "abort"  # the key of the line every rank ends with
BUSY = "busy"  # the key of the latest busy mark of any rank: one read tells a waiting rank that a peer writes
# a heartbeat's fields and their types: a signed value without them is a runtime's bug, said as a parse error
FIELDS = {
    "host": str,
    "t": (int, float),
    "step": int,
    "last": dict,
    "stack": (str, type(None)),
    "busy": (str, type(None)),
    "arrived": dict,
    "ended": bool,
}


def parsed(text: str) -> dict:
    """A heartbeat's fields; ValueError naming what is wrong."""
    record = json.loads(text)
    if not isinstance(record, dict):
        raise ValueError(f"a JSON {type(record).__name__}, not an object")
    wrong = [field for field, kind in FIELDS.items() if not isinstance(record.get(field), kind)]
    if wrong:
        raise ValueError(f"{', '.join(wrong)} missing or not of its type")
    if not all(isinstance(n, int) for n in [*record["last"].values(), *record["arrived"].values()]):
        raise ValueError("a sequence number or arrival time that is not an integer")
    return record


def overdue(entries: list[dict], now_ns: int, limit_s: float) -> dict | None:
    """The oldest collective of the flight recorder's `entries` that is unfinished and older than `limit_s`."""
    late = [e for e in entries if not e.get("retired", True) and now_ns - e["time_created_ns"] > limit_s * 1e9]
    return min(late, key=lambda e: e["time_created_ns"], default=None)


def fr_json() -> dict:
    """The flight recorder's current entries ({} when this torch has no recorder for the backend, or it is off)."""
    from torch._C import _distributed_c10d as c10d

    dump = getattr(c10d, "_dump_fr_trace_json", None) or getattr(c10d, "_dump_nccl_trace_json", None)
    try:
        return json.loads(dump(True, False)) if dump else {}
    except RuntimeError:  # torch < 2.8 on gloo: NCCL's dump, without NCCL
        return {}


def last_entered(entries: list[dict]) -> dict[str, int]:
    """Process group id → the sequence number of the last collective this rank entered. From the entries, not the
    dump's pg_status, whose counter counts send and recv too, which gloo's entries leave out (torch 2.14)."""
    last: dict[str, int] = {}
    for e in entries:
        if not e.get("is_p2p"):
            pg = e["process_group"][0]
            last[pg] = max(last.get(pg, -1), e["collective_seq_id"])
    return last


def where(frames: list[traceback.FrameSummary], most: int = 3) -> str:
    """The innermost frames of a stack, innermost first: `fn (file.py:12) < caller (file.py:40)`."""
    inner = list(reversed(frames))[:most]
    return " < ".join(f"{f.name} ({os.path.basename(f.filename)}:{f.lineno})" for f in inner)


def fresh(record: dict | None, now: float) -> bool:
    """A heartbeat read, and written within STALE_PERIODS."""
    return bool(record) and "t" in record and now - record["t"] <= STALE_PERIODS * PERIOD_S


def absent(records: Mapping[int, dict | None], pg: str | None, seq: int | None, now: float, me: int) -> list[int]:
    """The ranks that hold up collective `seq` of process group `pg`: no heartbeat (or none readable), one that
    stopped, or the collective never entered (known only with the flight recorder)."""
    return [
        rank
        for rank, r in sorted(records.items())
        if rank != me and (not fresh(r, now) or (seq is not None and r["last"].get(pg, -1) < seq))
    ]


def what(record: dict | None, now: float, pg: str | None = None) -> str:
    """What a held-up rank was doing, from its last heartbeat; with `pg`, the last collective it entered there."""
    if record is None:
        return "no heartbeat at all (it never reached training)"
    if "unread" in record:
        return record["unread"]
    entered = f", last entered #{record['last'][pg]}" if pg in record["last"] else ""
    if not fresh(record, now):
        return (
            f"no heartbeat for {now - record['t']:.0f} s at step {record['step']}{entered}: its process is stopped "
            "(SIGSTOP, a frozen host) or its network is gone"
        )
    doing = f"in {record['stack']}" if record.get("stack") else "running"
    return f"{doing} at step {record['step']}{entered}" + (f", {record['busy']}" if record.get("busy") else "")


def named(op: dict | None) -> str:
    """The collective waited for, as the line names it."""
    if op:
        return f"{op['profiling_name']} #{op['collective_seq_id']} of process group {op['process_group'][1]}"
    return "a collective (torch's flight recorder is off: TORCH_FR_BUFFER_SIZE)"


def line(op: dict | None, limit_s: float, me: int, records: Mapping[int, dict], held: list[int], now: float) -> str:
    """The one line every rank ends with."""
    mine, pg = records.get(me) or {}, op["process_group"][0] if op else None
    parts = [
        f"rank {r} on {(records.get(r) or {}).get('host', '?')} did not arrive: {what(records.get(r), now, pg)}"
        for r in held
    ] or [  # none named: each rank's state, for the reader to compare
        f"rank {r} on {(rec or {}).get('host', '?')}: {what(rec, now, pg)}"
        for r, rec in sorted(records.items())
        if r != me
    ]
    return (
        f"{named(op)} did not finish within the training timeout of {limit_s:g} s (training_timeout) on rank {me} "
        f"({mine.get('host', '?')}, step {mine.get('step', '?')}); " + "; ".join(parts)
    )


def unanswered(op: dict | None, limit_s: float, me: int, host: str, error: Exception, store: str) -> str:
    """The line of a rank that waited past the timeout and finds the store silent: no peer can tell it more."""
    waited = named(op) if op else "a step (the main thread made no progress)"
    return (
        f"{waited} did not finish within the training timeout of {limit_s:g} s (training_timeout) on rank {me} "
        f"({host}), and the job's store at {store} does not "
        f"answer ({error}): the process of rank 0 there is stopped or its host is gone"
    )


def forged_line(name: str, why: Forged, store: str) -> str:
    """The warning for a value that is not this job's."""
    return (
        f"warning: a value not signed by this job's ranks was written to {stored(name)} ({why}): ignored; the store "
        f"at {store} (MASTER_ADDR:MASTER_PORT) is reachable "
        "by something else"
    )


class Reader:
    """This job's values as a rank reads them from the store: one its ranks did not sign, or that does not parse, is
    said once for its key and read as not there (a value) or `unread` (a heartbeat)."""

    def __init__(self, key: bytes, store: str):
        self.key, self.store = key, store  # the store's address:port, for the line
        self.said: set[str] = set()  # the keys whose value was said to be not this job's, or unreadable

    def opened(self, name: str, value: bytes) -> str | None:
        """The text of a value this job's ranks signed; None, said once for the key, for any other."""
        try:
            return opened(self.key, name, value)
        except Forged as e:
            self._say_once(name, forged_line(name, e, self.store))
            return None

    def parsed(self, name: str, value: bytes | None) -> dict | None:
        """A heartbeat; one that is not this job's or does not parse is said once and read as `unread`."""
        if value is None:
            return None
        text = self.opened(name, value)
        if text is None:
            return {"unread": "its heartbeat in the store was replaced by a value not signed by this job's ranks"}
        try:
            return parsed(text)
        except ValueError as e:
            self._say_once(name, f"warning: the watchdog's heartbeat in {stored(name)} does not parse ({e})")
            return {"unread": f"its heartbeat does not parse ({e})"}

    def records(self, raw: Mapping[int, bytes | None]) -> dict[int, dict | None]:
        return {rank: self.parsed(str(rank), value) for rank, value in raw.items()}

    def _say_once(self, name: str, said: str) -> None:
        if name not in self.said:
            self.said.add(name)
            say(said)
