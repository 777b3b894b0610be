"""A hang names itself. Once training runs, a collective that does not finish within the training timeout ends the job
on every host in one line that names the operation, the ranks and hosts that did not arrive, and what they were doing:

    python train.py --training_timeout 300    # seconds; null: timeout_s's rule (FLOOR_S, TIMES_MEDIAN below), from
                                              # the first step on (the first step itself is a busy mark)
    torchfrtrace $SM_OUTPUT_DATA_DIR/flight_recorder -p rank_   # the dumps of the ranks that ended (NCCL's; torch
                                                                # 2.14.1's analyser fails on gloo's: pickle.load them)

Each rank runs a thread that, every PERIOD_S, writes a heartbeat to the job's TCP store, signed with a key the ranks
agreed on over the process group (heartbeats.py: the store answers anyone who reaches it; a call it does not answer
within PERIOD_S is given up): its host, step, the last collective it entered in each process group (torch's flight
recorder, TORCH_FR_BUFFER_SIZE: NCCL's, and gloo's in torch 2.14.1; plan.recorder_env sets it), what the runtime is
doing (writing a checkpoint: busy()), and, when its main thread has made no progress for a period, that thread's
innermost Python frames. A rank whose oldest unfinished collective is older than the timeout (without the flight
recorder: whose main thread made no progress for that long) compares the heartbeats: the ranks that never entered
that collective, or whose heartbeat stopped (SIGSTOP, a frozen host), are the ones named. A busy rank is no hang:
while any rank writes a checkpoint (status.py), and for a timeout after, nothing is judged (dist_timeout bounds it).
The line goes to the store first (the first written wins): every rank that reads it, the stuck one included when it
still runs, ends with it (global rank 0 adds the goodput so far); rank 0, whose process holds the store, ends once the
peers that still beat have read it. A rank that finds the store silent past the timeout ends with a line saying so.
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

from sagemaker_lightning import failure, lines
from sagemaker_lightning.health import heartbeats, stragglers
from sagemaker_lightning.health.heartbeats import (
    ABORT,
    BUSY,
    PERIOD_S,
    STALE_PERIODS,
    absent,
    fresh,
    last_entered,
    line,
    overdue,
    where,
)
from sagemaker_lightning.launch import paths
from sagemaker_lightning.lines import say
from sagemaker_lightning.toolbox.concern import Context, Part
from sagemaker_lightning.toolbox.lightning_package import made
from sagemaker_lightning.toolbox.status import Status

FLOOR_S = 120.0  # a derived timeout is at least this: a slow first batch of an epoch, validation's end, a save
TIMES_MEDIAN = 10  # a derived timeout: this many median steps
UNTIMED = 2  # intervals of a process's start not timed: up to the first batch, and the first step (it compiles and
# warms up: it is a busy mark, no hang, and no measure of the steps after it)
FIRST_STEP = "the first step (compiling, warming up)"  # the busy mark of each rank's first step
READ_PERIODS = 2  # rank 0, whose process holds the store, waits at most this long for peers to read the line (cli's
# fail waits 3 periods for the watchdog's exit)


def timeout_s(given: float | None, step_seconds: list[float], dist_timeout_s: float) -> float:
    """The training timeout: the user's, else TIMES_MEDIAN median steps timed so far, at least FLOOR_S (with none
    timed yet: FLOOR_S), at most dist_timeout. From the first step on: a hang in the first steps ends after the floor,
    not dist_timeout; the first step itself is a busy mark (Watchdog), however long it compiles."""
    if given is not None:
        return given
    median = statistics.median(step_seconds) if step_seconds else 0.0
    return min(max(FLOOR_S, TIMES_MEDIAN * median), dist_timeout_s)


class Watchdog:
    """The callback: times the training steps in the main thread (a few assignments a step), heartbeats and judges in
    its own thread from the start of training to its end. Several processes in a job only (plan.in_job)."""

    BASE = "callbacks.Callback"
    clock = staticmethod(time.monotonic)  # the main thread's progress, busy marks, the wait for the line's readers
    wall = staticmethod(time.time)  # heartbeats' times and the flight recorder's: hosts' clocks agree (NTP)
    pause = staticmethod(time.sleep)
    recorder = staticmethod(heartbeats.fr_json)  # the flight recorder's entries
    exit = staticmethod(os._exit)  # its main thread waits in a collective that would never return

    def __init__(self, *, given_s, plan, status=None, goodput=None):
        """plan: the job's (dist_timeout, this host, the store at its master, output.tar.gz's folder); status: the
        process's Status (its busy mark, ending, spread); goodput: the Attempt whose figures end the line."""
        self.given_s, self.dist_timeout_s, self.host, self.store = given_s, plan.timeout_s, plan.host, plan.master
        self.output_data_dir = plan.output_data_dir
        self.status: Status = status or Status()
        self.goodput = goodput
        self.thread: threading.Thread | None = None

    def on_train_start(self, trainer, pl_module):
        if trainer.world_size == 1:
            return
        key = heartbeats.agree_key(trainer.strategy.root_device)  # a collective: every rank, here
        self.begin(trainer.global_rank, trainer.world_size, trainer.global_step, key)
        self.thread = threading.Thread(target=self._run, name="sagemaker-lightning-watchdog", daemon=True)
        self.thread.start()

    def begin(self, rank: int, world_size: int, step: int, key: bytes) -> None:
        """The state the thread judges from."""
        self.rank, self.world_size, self.step, self.key = rank, world_size, step, key
        self.steps: deque[float] = deque(maxlen=100)  # the latest step times, for the median
        self.untimed = UNTIMED  # intervals not timed yet (UNTIMED)
        self.beat = self.answered = self.clock()  # the main thread's last progress; when the store last answered
        self.busy_seen = -float("inf")  # when this rank or a peer was last seen busy
        self.warned: dict[str, float] = {}  # host → when it was last named a straggler
        self.read = heartbeats.Reader(
            key, self.store
        )  # the job's values from the store, what is not this job's said once
        self.since_ns = 0  # the end of the first step: stragglers are judged from there on
        self.link = heartbeats.Link(lambda wait_s: heartbeats.connect(self.store, wait_s), PERIOD_S)
        self.stopping = threading.Event()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        now = self.clock()
        if self.thread:
            if self.untimed:
                self.untimed -= 1
            else:
                self.steps.append(now - self.beat)
            self.beat = now
            if self.untimed == 1 and self.status.doing is None:  # its first step: no hang however long it compiles
                self.status.doing = FIRST_STEP

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.thread:
            self.step = trainer.global_step  # steps done: a rank stuck before this step's hooks reports the same one
            self.since_ns = self.since_ns or time.time_ns()
            if self.status.doing == FIRST_STEP:
                self.status.doing = None

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
        # the first heartbeat at once: a rank frozen in its first steps (under a period of training) was named "?",
        # "it never reached training", for want of one
        while True:
            self.tick()
            if self.stopping.wait(PERIOD_S):
                return

    def tick(self) -> None:
        """One heartbeat: write this rank's, read the line, and judge when this rank's own wait passed the timeout:
        its oldest collective unfinished (without the flight recorder: its main thread without progress)."""
        fr = self.recorder()
        entries, now = fr.get("entries", []), self.wall()
        limit = timeout_s(self.given_s, list(self.steps), self.dist_timeout_s)
        op = overdue(entries, int(now * 1e9), limit)
        stalled = self.clock() - self.beat > limit
        waiting = op is not None or (stalled and not entries)
        if self.status.doing:
            self.busy_seen = self.clock()
        mine = self._record(fr, now)
        try:
            abort, busy_mark, raw = self.link.call(lambda store: self._exchange(store, mine, waiting))
        except heartbeats.Silent as e:  # silent as long as a stopped peer's heartbeat (a slow connect is not)
            silent = self.clock() - self.answered > STALE_PERIODS * PERIOD_S
            if silent and (waiting or stalled) and self._quiet(limit):  # a stuck rank too: no peer can tell it more
                self._end(heartbeats.unanswered(op, limit, self.rank, self.host, e, self.store))
            return
        self.answered = self.clock()
        if abort is not None and (said := self.read.opened(ABORT, abort)) is not None:
            self._end(said)
        if raw is not None:
            self._compare(self.read.records(raw), now)
        if busy_mark is not None and fresh(self.read.parsed(BUSY, busy_mark), now):
            self.busy_seen = self.clock()  # a peer writes: the wait is judged from the end of the write
        if waiting and self._quiet(limit):
            self._judge(op, limit, now)

    def _quiet(self, limit: float) -> bool:
        """No rank seen busy for the timeout: a wait for a checkpoint's write is no hang, nor the wait just after."""
        return self.clock() - self.busy_seen > limit

    def _record(self, fr: dict, now: float, ended: bool = False) -> dict:
        stalled = self.clock() - self.beat > PERIOD_S
        frame = sys._current_frames().get(threading.main_thread().ident) if stalled else None
        return {
            "host": self.host,
            "t": now,
            "step": self.step,
            "last": last_entered(fr.get("entries", [])),
            "stack": where(traceback.extract_stack(frame)) if frame else None,
            "busy": self.status.doing,
            "arrived": stragglers.arrivals(fr.get("entries", []), self.since_ns),  # when it entered its latest
            "ended": ended,  # it read the line: rank 0 need not keep the store up for it
        }

    def _exchange(self, store, mine: dict, waiting: bool) -> tuple:
        """In the link's thread: write this rank's heartbeat (and busy mark); read the line, the latest busy mark when
        this rank waits, and every heartbeat on rank 0 (stragglers)."""
        me = str(self.rank)
        store.set(me, heartbeats.signed(self.key, me, json.dumps(mine)))
        if mine["busy"]:
            store.set(BUSY, heartbeats.signed(self.key, BUSY, json.dumps(mine)))
        abort = store.get(ABORT) if store.check([ABORT]) else None
        busy_mark = store.get(BUSY) if waiting and store.check([BUSY]) else None
        return abort, busy_mark, self._all(store) if self.rank == 0 else None

    def _all(self, store) -> dict[int, bytes | None]:
        keys = [str(r) for r in range(self.world_size)]
        if store.check(keys):
            return dict(enumerate(store.multi_get(keys)))
        return {r: store.get(k) if store.check([k]) else None for r, k in enumerate(keys)}

    def _compare(self, records: Mapping[int, dict | None], now: float) -> None:
        """Rank 0: the hosts' spread for the progress line, and a warning for a straggler (stragglers.py)."""
        records = {r: record for r, record in records.items() if fresh(record, now)}  # a stopped one: _judge's
        late, span = stragglers.lateness({r: record["arrived"] for r, record in records.items()})
        found = stragglers.spread(late, span, {r: record["host"] for r, record in records.items()})
        self.status.spread = lines.spread(found)
        warning, clock = stragglers.warning(found), self.clock()
        if warning and clock - self.warned.get(found[0], -stragglers.WARN_EVERY_S) >= stragglers.WARN_EVERY_S:
            self.warned[found[0]] = clock
            say(warning)

    def _judge(self, op: dict | None, limit: float, now: float) -> None:
        """End the job: the ranks that hold this one up, named from their heartbeats."""
        try:
            records = self.read.records(self.link.call(self._all))
        except heartbeats.Silent as e:
            self._end(heartbeats.unanswered(op, limit, self.rank, self.host, e, self.store))
        pg, seq = (op["process_group"][0], op["collective_seq_id"]) if op else (None, None)
        held = absent(records, pg, seq, now, self.rank)
        self._end(self.claim(line(op, limit, self.rank, records, held, now)))

    def claim(self, said: str) -> str:
        """The line every rank ends with: the first one written to the store, this one if none was (or the store
        is silent, or holds a value that is not this job's)."""
        text = heartbeats.clipped(said)
        value = heartbeats.signed(self.key, ABORT, text)
        try:
            first = self.link.call(lambda store: store.compare_set(ABORT, "", value))
        except heartbeats.Silent:
            return text
        return self.read.opened(ABORT, first) or text

    def _end(self, said: str) -> None:
        """Keep the flight recorder's dump, report the line, mark it read, end the process. Rank 0's process holds
        the store: it ends once the peers that still beat have read the line."""
        self.status.ending.set()
        if self.output_data_dir:
            with contextlib.suppress(Exception):
                from torch._C import _distributed_c10d as c10d

                folder = paths.flight_recorder_dir(self.output_data_dir)
                os.makedirs(folder, exist_ok=True)
                with open(os.path.join(folder, f"rank_{self.rank}"), "wb") as f:
                    # no stacks: symbolizing them takes the GIL, which a stuck main thread may hold (pytorch#167023)
                    f.write(c10d._dump_fr_trace(True, False, False))
        if self.goodput is not None:  # where the time went, as any failure says
            said = self.goodput.so_far(said)
        failure.report(said)
        sys.stdout.flush()
        me, read = str(self.rank), json.dumps(self._record({}, self.wall(), ended=True))
        with contextlib.suppress(heartbeats.Silent):
            self.link.call(lambda store: store.set(me, heartbeats.signed(self.key, me, read)))
        if self.rank == 0:
            self._await_readers()
        self.exit(1)

    def _await_readers(self) -> None:
        """Until every peer whose heartbeat is fresh has read the line, READ_PERIODS at most (one that stopped in
        the meantime)."""
        deadline = self.clock() + READ_PERIODS * PERIOD_S
        while self.clock() < deadline:
            try:
                records = self.read.records(self.link.call(self._all))
            except heartbeats.Silent:
                return
            now = self.wall()
            if all(r["ended"] for rank, r in records.items() if rank != self.rank and fresh(r, now)):
                return
            self.pause(PERIOD_S / 8)


def concern(ctx: Context) -> Part:
    """The Watchdog in a job: a hang names itself, stragglers show."""
    if not ctx.plan.in_job:
        return Part()
    given_s, made_here = ctx.config["training_timeout"], made(Watchdog, ctx.pl)
    return Part(callbacks=[made_here(given_s=given_s, plan=ctx.plan, status=ctx.status, goodput=ctx.goodput)])
