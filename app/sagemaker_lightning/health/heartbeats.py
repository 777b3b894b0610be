"""The watchdog's values in the job's TCP store (judge.py): each rank's heartbeat, the busy mark and the abort line;
what a heartbeat says, and the line made of them.

The store answers anyone who reaches MASTER_PORT, so every value is HMAC-SHA256 signed with a key the ranks agree on
over the process group (not through the store), a value longer than MAX_VALUE_BYTES is not read further, and a value
that is not this job's is ignored. The store's client waits for an answer without a timeout (torch 2.14: a stopped
process of rank 0, which holds the store, holds the caller forever), so the watchdog's calls run in a thread of their
own (Link) and are given up after PERIOD_S.

    python -c "from sagemaker_lightning.health import heartbeats as h; k = b'k' * 32; print(h.opened(k, 'a', h.signed(k, 'a', 'x').encode()))"
"""

import hashlib
import hmac
import json
import os
import secrets
import threading
import traceback
from collections.abc import Callable, Mapping
from datetime import timedelta

from sagemaker_lightning.lines import say

PERIOD_S = 2.0  # between heartbeats, and the longest wait for the store: a hang is named this long after its timeout
STALE_PERIODS = 3  # a heartbeat older than this many periods: the process stopped answering
PREFIX = "sagemaker_lightning/watchdog"  # the watchdog's keys in the job's store: PREFIX/0, PREFIX/abort (stored())
ABORT = "abort"  # the key of the line every rank ends with
BUSY = "busy"  # the key of the latest busy mark of any rank: one read tells a waiting rank that a peer writes
KEY_BYTES = 32  # the job's signing key: drawn by rank 0, broadcast over the process group at the start of training
MAC_CHARS = 2 * hashlib.sha256().digest_size  # a value begins with its HMAC-SHA256 in hex
MAX_VALUE_BYTES = 64 * 1024  # a heartbeat is under 4 KB and a clipped abort line fits: a longer value is not ours
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


class Forged(Exception):
    """A value that this job's ranks did not write (unsigned, badly signed, or too long)."""


class Silent(Exception):
    """The store did not answer (in time, or with an error)."""


def agree_key(device) -> bytes:
    """The job's signing key: rank 0's random bytes, broadcast as a tensor over the default process group (every
    rank calls this at the same point). A tensor, not broadcast_object_list, which would unpickle what it receives."""
    import torch
    import torch.distributed as dist

    key = torch.frombuffer(bytearray(secrets.token_bytes(KEY_BYTES)), dtype=torch.uint8).to(device)
    dist.broadcast(key, src=0)  # the other ranks' draws are overwritten with rank 0's
    return bytes(key.cpu().tolist())


def _mac(key: bytes, name: str, text: str) -> str:
    """The value's signature, over its key's name too: a value copied to another key does not verify."""
    return hmac.new(key, f"{name}\n{text}".encode(), hashlib.sha256).hexdigest()


def signed(key: bytes, name: str, text: str) -> str:
    """`text` as the value of key `name`: its signature, then itself."""
    return _mac(key, name, text) + text


def clipped(text: str) -> str:
    """`text` cut so that its signed value fits MAX_VALUE_BYTES (an abort line naming thousands of ranks)."""
    room = MAX_VALUE_BYTES - MAC_CHARS - len("…".encode())
    raw = text.encode()
    return text if len(raw) <= MAX_VALUE_BYTES - MAC_CHARS else raw[:room].decode(errors="ignore") + "…"


def opened(key: bytes, name: str, value: bytes) -> str:
    """The text of a value of key `name` that this job's ranks signed; Forged otherwise. The length is checked
    before anything else is done with it."""
    if len(value) > MAX_VALUE_BYTES:
        raise Forged(f"{len(value)} bytes, over the {MAX_VALUE_BYTES} the watchdog reads")
    try:
        text = value[MAC_CHARS:].decode()
    except UnicodeDecodeError:
        raise Forged("not UTF-8 text") from None
    if not hmac.compare_digest(value[:MAC_CHARS], _mac(key, name, text).encode()):
        raise Forged("no valid signature")
    return text


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


def stored(name: str) -> str:
    """The key `name` as the store holds it (PrefixStore puts a / between)."""
    return f"{PREFIX}/{name}"


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
