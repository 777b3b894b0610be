"""The watchdog's thread (watchdog.py starts it with training and stops it at the end): each rank's, every PERIOD_S,
writes a heartbeat to the job's TCP store, signed with a key the ranks agreed on over the process group (signing.py: the
store answers anyone who reaches it; store_link.py: a call it does not answer within PERIOD_S is given up): its host,
step, the last collective it entered in each process group (torch's flight recorder, TORCH_FR_BUFFER_SIZE: NCCL's, and
gloo's in torch 2.14.1; plan.recorder_env sets it), what the runtime is doing (writing a checkpoint: busy()), and, when
its main thread has made no progress for a period, that thread's innermost Python frames. A rank whose oldest unfinished
collective is older than the timeout (without the flight recorder: whose main thread made no progress for that long)
compares the heartbeats: the ranks that never entered that collective, or whose heartbeat stopped (SIGSTOP, a frozen
host), are the ones named. A busy rank is no hang: while any rank writes a checkpoint (status.py), and for a timeout
after, nothing is judged (dist_timeout bounds it). The line goes to the store first (the first written wins): every rank
that reads it, the stuck one included when it still runs, ends with it (global rank 0 adds the goodput so far); rank 0,
whose process holds the store, ends once the peers that still beat have read it. A rank that finds the store silent past
the timeout ends with a line saying so. Imports no torch: torch's store client and flight recorder are imported where
called.

    .venv/bin/pytest tests/unit/health/test_watchdog_judgement.py    # one heartbeat at a time, its clocks the test's
"""

import contextlib
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sagemaker_lightning import failure, lines
from sagemaker_lightning.health import heartbeats, signing, store_link, stragglers
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
from sagemaker_lightning.toolbox.status import Status

READ_PERIODS = 2  # rank 0, whose process holds the store, waits at most this long for peers to read the line (cli's
# fail waits 3 periods for the watchdog's exit)


@dataclass
class Progress:
    """The main thread's progress, marked by the callback (watchdog.py) and read by the judge's thread."""

    beat: float  # the main thread's last progress, on the judge's clock
    step: int  # steps done (trainer.global_step at the end of the latest)
    since_ns: int = 0  # the end of the first step: stragglers are judged from there on


class Judge:
    """One rank's heartbeats and judgement, in its own thread (run) from the start of training to its end."""

    wall = staticmethod(time.time)  # heartbeats' times and the flight recorder's: hosts' clocks agree (NTP)
    pause = staticmethod(time.sleep)
    recorder = staticmethod(heartbeats.fr_json)  # the flight recorder's entries
    exit = staticmethod(os._exit)  # its main thread waits in a collective that would never return

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        key: bytes,
        plan,
        progress: Progress,
        limit: Callable[[], float],
        clock: Callable[[], float],
        status: Status,
        goodput,
    ):
        """key: the one the ranks agreed on; plan: the job's (this host, the store at its master, output.tar.gz's
        folder); limit: the training timeout now (watchdog.timeout_s); clock: the monotonic one progress is marked on
        (the busy marks and the wait for the line's readers too); status: the process's Status (its busy mark,
        ending, spread); goodput: the Attempt whose figures end the line, or None."""
        self.rank, self.world_size, self.key, self.progress, self.limit = rank, world_size, key, progress, limit
        self.host, self.store, self.output_data_dir = plan.host, plan.master, plan.output_data_dir
        self.clock, self.status, self.goodput = clock, status, goodput
        self.answered = self.clock()  # when the store last answered
        self.busy_seen = -float("inf")  # when this rank or a peer was last seen busy
        self.warned: dict[str, float] = {}  # host → when it was last named a straggler
        # the job's values from the store, what is not this job's said once
        self.read = heartbeats.Reader(key, self.store)
        self.link = store_link.Link(lambda wait_s: store_link.connect(self.store, wait_s), PERIOD_S)
        self.stopping = threading.Event()

    def run(self) -> None:
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
        limit = self.limit()
        op = overdue(entries, int(now * 1e9), limit)
        stalled = self.clock() - self.progress.beat > limit
        waiting = op is not None or (stalled and not entries)
        if self.status.doing:
            self.busy_seen = self.clock()
        mine = self._record(fr, now)
        try:
            abort, busy_mark, raw = self.link.call(lambda store: self._exchange(store, mine, waiting))
        except store_link.Silent as e:  # silent as long as a stopped peer's heartbeat (a slow connect is not)
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
        stalled = self.clock() - self.progress.beat > PERIOD_S
        frame = sys._current_frames().get(threading.main_thread().ident) if stalled else None
        return {
            "host": self.host,
            "t": now,
            "step": self.progress.step,
            "last": last_entered(fr.get("entries", [])),
            "stack": where(traceback.extract_stack(frame)) if frame else None,
            "busy": self.status.doing,
            "arrived": stragglers.arrivals(fr.get("entries", []), self.progress.since_ns),  # when it entered its latest
            "ended": ended,  # it read the line: rank 0 need not keep the store up for it
        }

    def _exchange(self, store, mine: dict, waiting: bool) -> tuple:
        """In the link's thread: write this rank's heartbeat (and busy mark); read the line, the latest busy mark when
        this rank waits, and every heartbeat on rank 0 (stragglers)."""
        me = str(self.rank)
        store.set(me, signing.signed(self.key, me, json.dumps(mine)))
        if mine["busy"]:
            store.set(BUSY, signing.signed(self.key, BUSY, json.dumps(mine)))
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
        except store_link.Silent as e:
            self._end(heartbeats.unanswered(op, limit, self.rank, self.host, e, self.store))
        pg, seq = (op["process_group"][0], op["collective_seq_id"]) if op else (None, None)
        held = absent(records, pg, seq, now, self.rank)
        self._end(self.claim(line(op, limit, self.rank, records, held, now)))

    def claim(self, said: str) -> str:
        """The line every rank ends with: the first one written to the store, this one if none was (or the store
        is silent, or holds a value that is not this job's)."""
        text = signing.clipped(said)
        value = signing.signed(self.key, ABORT, text)
        try:
            first = self.link.call(lambda store: store.compare_set(ABORT, "", value))
        except store_link.Silent:
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
        with contextlib.suppress(store_link.Silent):
            self.link.call(lambda store: store.set(me, signing.signed(self.key, me, read)))
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
            except store_link.Silent:
                return
            now = self.wall()
            if all(r["ended"] for rank, r in records.items() if rank != self.rank and fresh(r, now)):
                return
            self.pause(PERIOD_S / 8)
