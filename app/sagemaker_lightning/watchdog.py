"""A hang names itself. Once training runs, a collective that does not finish within the training timeout ends the job
on every host in one line that names the operation, the ranks and hosts that did not arrive, and what they were doing:

    python train.py --training_timeout 300    # seconds; null: timeout_s's rule (FLOOR_S, TIMES_MEDIAN below)
    torchfrtrace $SM_OUTPUT_DATA_DIR/flight_recorder -p rank_   # the dumps of the ranks that ended (NCCL's; torch
                                                                # 2.14.1's analyser fails on gloo's: pickle.load them)

Each rank runs a thread that, every PERIOD_S, writes a heartbeat to the job's TCP store (its own connection, with a
short timeout: a store that stops answering is named, not waited for): its host, step, the last collective it
entered in each process group (torch's flight recorder, TORCH_FR_BUFFER_SIZE: NCCL's, and gloo's in torch 2.14.1;
plan.recorder_env sets it),
what the runtime is doing (writing a checkpoint: a wait for it is no hang), and, when its main thread has made no
progress for a period, that thread's innermost Python frames. A rank whose oldest unfinished collective is
older than the timeout compares the heartbeats: the ranks that never entered that collective, or whose heartbeat
stopped (SIGSTOP, a frozen host), are the ones named. The line goes to the store first (the first one written wins),
so every rank that reads it, the stuck one included when it still runs, ends with the same line. Without the flight
recorder (older torch), a main thread with no progress for the timeout is the trigger.
"""

import contextlib
import json
import os
import statistics
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Mapping
from datetime import timedelta

from sagemaker_lightning import failure, paths, stragglers
from sagemaker_lightning.flavor import made
from sagemaker_lightning.lines import say

FLOOR_S = 120.0  # a derived timeout is at least this: a slow first batch of an epoch, validation's end, a save
TIMES_MEDIAN = 10  # a derived timeout: this many median steps
MEASURED_STEPS = 10  # steps timed before a derived timeout applies; dist_timeout until then
PERIOD_S = 2.0  # between heartbeats: a hang is named at most about this long after its timeout
STALE_PERIODS = 3  # a heartbeat older than this many periods: the process stopped answering
ABORT = "abort"  # the store's key for the line every rank ends with
PREFIX = "sagemaker_lightning/watchdog/"

ENDING = threading.Event()  # set when the thread ends the process: the main thread's own error then is a consequence
_busy: str | None = None  # what the runtime's main thread is doing that takes long and is no hang (busy())


@contextlib.contextmanager
def busy(what: str):
    """Mark a long operation of this process (a checkpoint's write) that peers may wait for: not a hang."""
    global _busy
    _busy = what
    try:
        yield
    finally:
        _busy = None


def timeout_s(given: float | None, step_seconds: list[float], dist_timeout_s: float) -> float:
    """The training timeout: the user's, else TIMES_MEDIAN median steps (at least FLOOR_S, at most dist_timeout) once
    MEASURED_STEPS are timed, else dist_timeout."""
    if given is not None:
        return given
    if len(step_seconds) < MEASURED_STEPS:
        return dist_timeout_s
    return min(max(FLOOR_S, TIMES_MEDIAN * statistics.median(step_seconds)), dist_timeout_s)


def overdue(entries: list[dict], now_ns: int, limit_s: float) -> dict | None:
    """The oldest collective of the flight recorder's `entries` that is unfinished and older than `limit_s`."""
    late = [e for e in entries if not e.get("retired", True) and now_ns - e["time_created_ns"] > limit_s * 1e9]
    return min(late, key=lambda e: e["time_created_ns"], default=None)


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


def absent(records: Mapping[int, dict | None], pg: str | None, seq: int | None, now: float, me: int) -> list[int]:
    """The ranks that hold up collective `seq` of process group `pg`: no heartbeat, one that stopped, or the
    collective never entered (known only with the flight recorder)."""
    return [
        rank
        for rank, r in sorted(records.items())
        if rank != me
        and (r is None or now - r["t"] > STALE_PERIODS * PERIOD_S or (seq is not None and r["last"].get(pg, -1) < seq))
    ]


def what(record: dict | None, now: float, pg: str | None = None) -> str:
    """What a held-up rank was doing, from its last heartbeat; with `pg`, the last collective it entered there."""
    if record is None:
        return "no heartbeat at all (it never reached training)"
    entered = f", last entered #{record['last'][pg]}" if pg in record["last"] else ""
    if now - record["t"] > STALE_PERIODS * PERIOD_S:
        return (
            f"no heartbeat for {now - record['t']:.0f} s at step {record['step']}{entered}: its process is stopped "
            "(SIGSTOP, a frozen host) or its network is gone"
        )
    doing = f"in {record['stack']}" if record.get("stack") else "running"
    return f"{doing} at step {record['step']}{entered}" + (f", {record['busy']}" if record.get("busy") else "")


def line(op: dict | None, limit_s: float, me: int, records: Mapping[int, dict], held: list[int], now: float) -> str:
    """The one line every rank ends with."""
    if op:
        name = f"{op['profiling_name']} #{op['collective_seq_id']} of process group {op['process_group'][1]}"
    else:
        name = "a collective (torch's flight recorder is off: TORCH_FR_BUFFER_SIZE)"
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
        f"{name} did not finish within the training timeout of {limit_s:g} s (training_timeout) on rank {me} "
        f"({mine.get('host', '?')}, step {mine.get('step', '?')}); " + "; ".join(parts)
    )


def _connect():
    """A connection of this thread's own to the job's TCP store, whose operations give up after PERIOD_S."""
    import torch.distributed as dist

    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    tcp = dist.TCPStore(address, port, is_master=False, timeout=timedelta(seconds=PERIOD_S), wait_for_workers=False)
    return dist.PrefixStore(PREFIX, tcp)


def _fr_json() -> dict:
    """The flight recorder's current entries ({} when this torch has no recorder for the backend, or it is off)."""
    from torch._C import _distributed_c10d as c10d

    dump = getattr(c10d, "_dump_fr_trace_json", None) or getattr(c10d, "_dump_nccl_trace_json", None)
    try:
        return json.loads(dump(True, False)) if dump else {}
    except RuntimeError:  # torch < 2.8 on gloo: NCCL's dump, without NCCL
        return {}


class Watchdog:
    """The callback: times the training steps in the main thread (a few assignments a step), heartbeats and judges in
    its own thread from the start of training to its end. Several processes on SageMaker only."""

    BASE = "callbacks.Callback"
    clock = staticmethod(time.monotonic)

    def __init__(self, given_s: float | None, dist_timeout_s: float, host: str, output_data_dir: str | None):
        self.given_s, self.dist_timeout_s = given_s, dist_timeout_s
        self.host, self.output_data_dir = host, output_data_dir
        self.thread: threading.Thread | None = None
        self.spread = ""  # rank 0: the progress line's words on stragglers (stragglers.words)

    def on_train_start(self, trainer, pl_module):
        if trainer.world_size == 1:
            return
        self.rank, self.world_size, self.step = trainer.global_rank, trainer.world_size, trainer.global_step
        self.steps: deque[float] = deque(maxlen=100)  # the latest step times, for the median
        self.beat = self.clock()  # the main thread's last progress
        self.warned: dict[str, float] = {}  # host → when it was last named a straggler
        self.since_ns = 0  # the end of the first step: stragglers are judged from there on
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sagemaker-lightning-watchdog", daemon=True)
        self.thread.start()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        now = self.clock()
        if self.thread:
            self.steps.append(now - self.beat)
            self.beat = now

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.thread:
            self.step = trainer.global_step  # steps done: a rank stuck before this step's hooks reports the same one
            self.since_ns = self.since_ns or time.time_ns()

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.thread:
            self.beat = self.clock()

    def on_train_end(self, trainer, pl_module):
        self._stop()

    def teardown(self, trainer, pl_module, stage):
        self._stop()

    def _stop(self) -> None:
        if self.thread:
            self.stopping.set()
            self.thread.join(timeout=2 * PERIOD_S)
            self.thread = None

    # ---- the thread -----------------------------------------------------------------------------------------------

    def _run(self) -> None:
        store = None
        while not self.stopping.wait(PERIOD_S):
            fr = _fr_json()
            try:
                store = store or _connect()
                store.set(str(self.rank), json.dumps(self._record(fr)))
                if store.check([ABORT]):
                    self._end(store.get(ABORT).decode())
                if self.rank == 0:
                    self._compare(store)
                self._judge(fr, store)
            except Exception as e:  # noqa: BLE001  the store did not answer: judged without it
                store = None
                self._judge(fr, None, e)

    def _record(self, fr: dict) -> dict:
        stalled = self.clock() - self.beat > PERIOD_S
        frame = sys._current_frames().get(threading.main_thread().ident) if stalled else None
        return {
            "host": self.host,
            "t": time.time(),  # hosts' clocks agree to milliseconds (NTP on SageMaker; one clock in local mode)
            "step": self.step,
            "last": last_entered(fr.get("entries", [])),
            "stack": where(traceback.extract_stack(frame)) if frame else None,
            "busy": _busy,
            "arrived": stragglers.arrivals(fr.get("entries", []), self.since_ns),  # when it entered its latest
        }

    def _compare(self, store) -> None:
        """Rank 0: the hosts' spread for the progress line, and a warning for a straggler (stragglers.py)."""
        keys = [str(r) for r in range(self.world_size)]
        records = {r: json.loads(v) for r, v in enumerate(store.multi_get(keys))} if store.check(keys) else {}
        now = time.time()  # a rank whose heartbeat stopped is a hang's business (_judge), not a straggler
        records = {r: record for r, record in records.items() if now - record["t"] <= STALE_PERIODS * PERIOD_S}
        late, span = stragglers.lateness({r: record["arrived"] for r, record in records.items()})
        found = stragglers.spread(late, span, {r: record["host"] for r, record in records.items()})
        self.spread = stragglers.words(found)
        warning, now = stragglers.warning(found), self.clock()
        if warning and now - self.warned.get(found[0], -stragglers.WARN_EVERY_S) >= stragglers.WARN_EVERY_S:
            self.warned[found[0]] = now
            say(warning)

    def _judge(self, fr: dict, store, error: Exception | None = None) -> None:
        """End the job when this rank's oldest collective has been unfinished for the training timeout (without the
        flight recorder: its main thread made no progress for that long), unless a peer it waits for is busy."""
        limit = timeout_s(self.given_s, list(self.steps), self.dist_timeout_s)
        op = overdue(fr.get("entries", []), time.time_ns(), limit)
        if (op is None and fr.get("entries")) or self.clock() - self.beat <= limit:
            return
        if store is None:
            self._end(
                f"a collective did not finish within the training timeout of {limit:g} s (training_timeout) on rank "
                f"{self.rank} ({self.host}), and the job's store at {os.environ.get('MASTER_ADDR')} does not answer "
                f"({error}): the process of rank 0 there is stopped or its host is gone"
            )
        now, keys = time.time(), [str(r) for r in range(self.world_size)]
        records = {r: json.loads(store.get(k)) if store.check([k]) else None for r, k in enumerate(keys)}
        pg, seq = (op["process_group"][0], op["collective_seq_id"]) if op else (None, None)
        held = absent(records, pg, seq, now, self.rank)
        if any(records[r] and records[r]["busy"] and now - records[r]["t"] <= STALE_PERIODS * PERIOD_S for r in held):
            return  # a peer writes a checkpoint: dist_timeout bounds that wait
        self._end(store.compare_set(ABORT, "", line(op, limit, self.rank, records, held, now)).decode())

    def _end(self, said: str) -> None:
        """Keep the flight recorder's dump, report the line, end the process (its main thread waits in a collective
        that would never return). Rank 0's process may hold the store: it waits for its peers to read the line."""
        ENDING.set()
        if self.output_data_dir:
            with contextlib.suppress(Exception):
                from torch._C import _distributed_c10d as c10d

                os.makedirs(paths.flight_recorder_dir(self.output_data_dir), exist_ok=True)
                with open(
                    os.path.join(paths.flight_recorder_dir(self.output_data_dir), f"rank_{self.rank}"), "wb"
                ) as f:
                    # no stacks: symbolizing them takes the GIL, which a stuck main thread may hold (pytorch#167023)
                    f.write(c10d._dump_fr_trace(True, False, False))
        failure.report(said)
        sys.stdout.flush()
        if self.rank == 0:
            time.sleep(2 * PERIOD_S)
        os._exit(1)


def callbacks(pl, plan, config) -> list:
    """The Watchdog on SageMaker: a hang names itself, stragglers show."""
    if not plan.on_sagemaker:
        return []
    return [made(Watchdog, pl)(config["training_timeout"], plan.timeout_s, plan.host, plan.output_data_dir)]
