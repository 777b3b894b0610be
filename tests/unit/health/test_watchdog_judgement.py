"""The watchdog's judgement, one heartbeat at a time: its clocks moved by the test (no real waiting), the job's store a
real TCPStore in this process, each rank's flight recorder given. The derived timeout, the trigger with and without
the flight recorder, a busy rank, the first line written, the stuck rank's own ending, a store that does not answer.

    .venv/bin/pytest tests/unit/health/test_watchdog_judgement.py
"""

import functools
import gc
import threading
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from sagemaker_lightning import failure, goodput
from sagemaker_lightning.health import heartbeats, judge, store_link, watchdog

pytestmark = pytest.mark.unit

DIST_S = 1800.0  # dist_timeout
LIMIT = 100.0  # the training_timeout given, where the derived one is not the point
KEY = bytes(range(32))  # the key the ranks agreed on
STALE_S = heartbeats.STALE_PERIODS * heartbeats.PERIOD_S  # a heartbeat, or the store, silent this long: stopped


class Ended(Exception):
    """A watchdog's exit: its process ends here, with `line`."""

    def __init__(self, rank: int, line: str):
        super().__init__(rank, line)
        self.rank, self.line = rank, line


class Job:
    """Ranks of one job in this process: each a Watchdog and its Judge on the shared clocks, the judge's store calls
    to the job's store."""

    def __init__(self, store):
        self.store, self.port = store, store.port
        self.address = f"127.0.0.1:{store.port}"  # the plan's MASTER_ADDR:MASTER_PORT, where the watchdogs connect
        self.mono, self.wall = 100.0, 1_000_000.0  # the monotonic clock, and the hosts' (seconds)
        self.reported: list[str] = []

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds

    def entry(self, seq: int, age_s: float, retired: bool) -> dict:
        """A flight recorder entry (torch 2.14's _dump_fr_trace_json, the keys read) entered `age_s` ago."""
        created = int((self.wall - age_s) * 1e9)
        return {
            "collective_seq_id": seq,
            "profiling_name": "gloo:all_reduce",
            "process_group": ["0", "default_pg"],
            "retired": retired,
            "time_created_ns": created,
        }

    def rank(self, rank: int, entries: list | None = None, given: float | None = LIMIT, world: int = 2):
        """Rank `rank`'s watchdog, its main thread's last progress now, its judge (wd.judge) begun; `entries`: its
        flight recorder's (a list the test may change), None: no flight recorder."""
        plan = SimpleNamespace(timeout_s=DIST_S, host=f"algo-{rank + 1}", master=self.address, output_data_dir=None)
        wd = watchdog.Watchdog(given_s=given, plan=plan)
        wd.clock = lambda: self.mono  # the judge's too: begin hands it on
        wd.begin(rank, world, 5, KEY)
        wd.judge.wall, wd.judge.pause = (lambda: self.wall), self.advance
        wd.judge.recorder = lambda: {"entries": list(entries)} if entries is not None else {}
        wd.judge.link = store_link.Link(
            functools.partial(store_link.connect, self.address), wait_s=60
        )  # this store answers: a connect can take 5 s
        wd.thread = threading.current_thread()  # the hooks time steps while the thread runs

        def exit(code):
            raise Ended(rank, self.reported[-1])

        wd.judge.exit = exit
        return wd


def started(monkeypatch) -> Job:
    """A job's store (the process of rank 0 holds it); the failure lines kept."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    made = Job(store)
    monkeypatch.setattr(failure, "report", made.reported.append)
    return made


@pytest.fixture
def job(monkeypatch):
    yield started(monkeypatch)
    # the test's stores and clients freed now, not by a later collection inside the next test's TCPStore: that took
    # 5 s of a setup, twice a run (2 AMD EPYC cores, torch 2.14.1); this file 5.5 s before, 1.7 s after
    gc.collect()


def steps(wd, *numbers: int) -> None:
    """Rank `wd`'s training steps `numbers` start and end (in this process: its busy mark too)."""
    for n in numbers:
        wd.step_start(None, n)
        wd.step_end(None, n + 1, None, None)


@pytest.mark.parametrize("step_s", [1.0, 20.0])
def test_the_derived_timeout_is_ten_median_steps_and_at_least_the_floor(job, step_s):
    """No training_timeout given: TIMES_MEDIAN median steps, at least FLOOR_S, from the first step timed on (the
    interval up to the first batch and the first step itself are not timed: watchdog.UNTIMED)."""
    wd = job.rank(1, given=None)
    job.advance(600)  # the loader's start: not a measure of the steps
    steps(wd, 0)
    job.advance(600)  # a first step that compiles: neither
    for batch in range(1, 4):
        steps(wd, batch)
        job.advance(step_s)
    wd.step_start(None, 4)
    limit = max(watchdog.FLOOR_S, watchdog.TIMES_MEDIAN * step_s)  # 120 s, 200 s
    job.advance(limit - 1)
    wd.judge.tick()  # just within it
    job.advance(2)
    with pytest.raises(Ended) as ended:
        wd.judge.tick()
    assert f"within the training timeout of {limit:g} s (training_timeout) on rank 1 (algo-2" in ended.value.line


def test_a_hang_in_the_first_steps_ends_after_the_floor_and_a_first_step_that_compiles_is_none(job):
    """Defaults (no training_timeout): rank 0's first step compiles for three floors while rank 1 waits for it in
    the first all-reduce: no hang (rank 0's busy mark). Rank 0 then freezes (SIGSTOP: no heartbeat) at the start of
    step 2: rank 1 ends after the floor, not dist_timeout, naming rank 0."""
    entries: list = []
    zero, one = job.rank(0, entries=[], given=None), job.rank(1, entries=entries, given=None)
    steps(one, 0)  # rank 1's first step is done; it waits in the all-reduce of rank 0's first step
    entries.append(job.entry(1, 0, retired=False))
    zero.step_start(None, 0)
    assert zero.status.doing == watchdog.FIRST_STEP
    for _ in range(int(3 * watchdog.FLOOR_S / heartbeats.PERIOD_S)):
        job.advance(heartbeats.PERIOD_S)
        zero.judge.tick()
        one.judge.tick()  # no line: rank 0 is busy
    entries[-1]["retired"] = True  # rank 0's first step ends; a second one, quick, on both
    zero.step_end(None, 1, None, None)
    assert zero.status.doing is None
    steps(zero, 1)
    steps(one, 1)
    job.advance(1.0)
    zero.step_start(None, 2)
    one.step_start(None, 2)
    zero.judge.tick()  # rank 0's last heartbeat: SIGSTOP
    entries.append(job.entry(2, 0, retired=False))  # rank 1 waits in step 2's all-reduce
    ticks = 0
    with pytest.raises(Ended) as ended:
        while ticks < (watchdog.FLOOR_S + 30) / heartbeats.PERIOD_S:
            job.advance(heartbeats.PERIOD_S)
            ticks += 1
            one.judge.tick()
    assert f"within the training timeout of {watchdog.FLOOR_S:g} s (training_timeout) on rank 1" in ended.value.line
    assert "rank 0 on algo-1 did not arrive: no heartbeat" in ended.value.line, ended.value.line
    assert watchdog.FLOOR_S <= ticks * heartbeats.PERIOD_S <= watchdog.FLOOR_S + 2 * heartbeats.PERIOD_S


def test_without_the_flight_recorder_a_main_thread_without_progress_is_the_trigger(job):
    wd = job.rank(1)
    job.advance(LIMIT - 1)
    wd.judge.tick()
    job.advance(2)
    with pytest.raises(Ended) as ended:
        wd.judge.tick()
    assert ended.value.line.startswith("a collective (torch's flight recorder is off: TORCH_FR_BUFFER_SIZE) did not")
    assert ended.value.line.endswith("rank 0 on ? did not arrive: no heartbeat at all (it never reached training)")


def test_with_the_flight_recorder_the_oldest_unfinished_collective_is_the_trigger(job):
    """A main thread without progress but in no collective (a rank stuck in Python) is named by its peers, whose
    collective waits for it, not by itself."""
    entries = [job.entry(6, 0, retired=True)]
    wd = job.rank(1, entries)
    job.advance(10 * LIMIT)
    wd.judge.tick()
    entries.append(job.entry(7, LIMIT - 1, retired=False))
    wd.judge.tick()
    job.advance(2)
    with pytest.raises(Ended) as ended:
        wd.judge.tick()
    assert ended.value.line.startswith("gloo:all_reduce #7 of process group default_pg did not finish within")


def test_a_rank_writing_a_checkpoint_is_no_hang_without_the_flight_recorder(job):
    """Its own main thread makes no progress while it writes: it judges nothing until a timeout after the write."""
    wd = job.rank(0)
    with wd.status.busy("writing last.ckpt"):
        job.advance(10 * LIMIT)
        wd.judge.tick()
    job.advance(LIMIT - 1)
    wd.judge.tick()  # the write ended a moment ago: the wait is judged from there
    job.advance(2)
    with pytest.raises(Ended):
        wd.judge.tick()


@pytest.mark.parametrize("recorder", [False, True])
def test_a_peer_writing_a_checkpoint_is_no_hang(job, recorder):
    """Rank 1 waits for rank 0, which writes last.ckpt and beats: no hang during the write, nor a timeout after it
    (rank 1's collective finishes just after the write; a heartbeat period may pass before it shows)."""
    entries = [job.entry(7, 0, retired=False)] if recorder else None
    writer, waiter = job.rank(0, [job.entry(6, 0, retired=True)]), job.rank(1, entries)
    job.advance(LIMIT + 1)
    for _ in range(5):
        with writer.status.busy("writing last.ckpt"):  # the mark is the process's: rank 0's
            writer.judge.tick()
        waiter.judge.tick()  # past the timeout: it reads rank 0's busy mark
        job.advance(watchdog.PERIOD_S)
    writer.judge.tick()
    job.advance(LIMIT - 1 - 5 * watchdog.PERIOD_S)
    writer.judge.tick()
    waiter.judge.tick()
    job.advance(5 * watchdog.PERIOD_S + 2)
    writer.judge.tick()
    with pytest.raises(Ended) as ended:  # still waiting a timeout after the write: a hang
        waiter.judge.tick()
    assert "rank 0 on algo-1" in ended.value.line


def test_a_busy_peer_whose_heartbeat_stopped_is_a_hang(job):
    """A rank that was writing and then stopped (SIGSTOP, a frozen host) does not hold the judgement off."""
    writer, waiter = job.rank(0, [job.entry(6, 0, retired=True)]), job.rank(1)
    with writer.status.busy("writing last.ckpt"):
        writer.judge.tick()
    job.advance(LIMIT + 1)
    with pytest.raises(Ended) as ended:
        waiter.judge.tick()
    assert f"rank 0 on algo-1 did not arrive: no heartbeat for {LIMIT + 1:.0f} s at step 5" in ended.value.line


def test_the_first_line_written_wins(job):
    first, second = job.rank(1), job.rank(0)
    assert first.judge.claim("rank 1's line") == "rank 1's line"
    assert second.judge.claim("rank 0's line") == "rank 1's line"


def test_every_rank_ends_with_the_first_line_the_stuck_one_too(job):
    """Rank 1 judges first; rank 0 then reads its line and ends with it: rank 0 waits in no collective (it is stuck
    in Python: its flight recorder holds finished ones only), so only the line can end it."""
    stuck, judging = job.rank(0, [job.entry(6, 0, retired=True)]), job.rank(1)
    job.advance(LIMIT + 1)
    with pytest.raises(Ended) as ended:
        judging.judge.tick()
    with pytest.raises(Ended) as read:
        stuck.judge.tick()
    assert read.value.line == ended.value.line
    assert "on rank 1 (algo-2" in read.value.line


def test_rank_0_keeps_the_store_up_until_the_stuck_rank_has_read_the_line(job):
    """Rank 0's process holds the store: it ends once each peer that still beats has read the line (its heartbeat
    says so), not after a fixed sleep that a slow reader could outlast."""
    judging, stuck = job.rank(0), job.rank(1, [job.entry(6, 0, retired=True)])
    job.advance(LIMIT + 1)
    stuck.judge.tick()  # beats: rank 0 waits for it
    read, paused = [], []

    def pause(seconds):  # while rank 0 waits, time passes and rank 1 beats
        paused.append(seconds)
        job.advance(seconds)
        try:
            stuck.judge.tick()
        except Ended as e:
            read.append(e.line)

    judging.judge.pause = pause
    with pytest.raises(Ended) as ended:
        judging.judge.tick()
    assert read == [ended.value.line]
    assert len(paused) == 1  # it ended once rank 1 had read the line, not at its bound


def test_rank_0_waits_a_bounded_time_for_a_peer_that_never_reads_the_line(job):
    judging, silent = job.rank(0), job.rank(1, [job.entry(6, 0, retired=True)])
    job.advance(LIMIT + 1)
    silent.judge.tick()  # it beats once, then its watchdog thread never runs again (its heartbeat is fresh for a while)
    paused = []
    judging.judge.pause = lambda seconds: paused.append(seconds) or job.advance(seconds)
    with pytest.raises(Ended):
        judging.judge.tick()
    assert judge.READ_PERIODS * watchdog.PERIOD_S <= sum(paused) <= (judge.READ_PERIODS + 1) * watchdog.PERIOD_S


@pytest.fixture
def silent_store():
    """A Link whose store never answers (a stopped process of rank 0: TCPStore's client waits without a timeout);
    the connections it tried."""
    gate, tried = threading.Event(), []

    def connect(wait_s):
        tried.append(wait_s)
        gate.wait()
        raise ConnectionError("released")

    yield store_link.Link(connect, wait_s=0.05), tried
    gate.set()


def test_a_store_that_does_not_answer_holds_nothing_and_is_named_past_the_timeout(job, silent_store):
    """The thread goes on beating (nothing waits longer than the Link's wait, one call at most waits on the store);
    past the timeout, the line says the store does not answer, where it is, and what it means."""
    wd = job.rank(1)
    wd.judge.link, tried = silent_store
    job.advance(STALE_S + 1)
    wd.judge.tick()
    job.advance(LIMIT - STALE_S - 2)
    wd.judge.tick()
    assert len(tried) == 1  # the second beat did not start a call behind the first
    job.advance(2)
    with pytest.raises(Ended) as ended:
        wd.judge.tick()
    assert ended.value.line == (
        "a step (the main thread made no progress) did not finish within the training timeout of 100 s "
        f"(training_timeout) on rank 1 (algo-2), and the job's store at 127.0.0.1:{job.port} does not answer (an "
        "earlier call still waits for its answer): the process of rank 0 there is stopped or its host is gone"
    )


def test_a_store_that_misses_a_beat_is_not_blamed(job, silent_store):
    """One call without an answer (TCPStore's client sometimes takes 5 s to connect) is not a silent store: as long
    as a peer's heartbeat, before the line blames it."""
    stuck = job.rank(1, [job.entry(6, 0, retired=True)])  # stuck past the timeout, in no collective
    job.advance(LIMIT + 1)
    stuck.judge.tick()  # the store answers
    stuck.judge.link, _ = silent_store
    stuck.judge.tick()
    job.advance(STALE_S - 1)
    stuck.judge.tick()
    job.advance(2)
    with pytest.raises(Ended) as ended:
        stuck.judge.tick()
    assert "does not answer" in ended.value.line


def test_a_stuck_rank_that_can_no_longer_read_the_line_ends_on_its_own(job, silent_store):
    """Rank 0 ended (its store with it) before the stuck rank read the line: stuck past the timeout, it ends."""
    stuck = job.rank(1, [job.entry(6, 0, retired=True)])
    stuck.judge.link, _ = silent_store
    job.advance(LIMIT + 1)
    with pytest.raises(Ended) as ended:
        stuck.judge.tick()
    assert "does not answer" in ended.value.line


def test_a_silent_store_ends_no_rank_that_writes_a_checkpoint(job, silent_store):
    wd = job.rank(0)
    wd.judge.link, _ = silent_store
    job.advance(LIMIT + 1)
    with wd.status.busy("writing last.ckpt"):
        wd.judge.tick()


def test_a_ranks_first_heartbeat_is_written_as_its_thread_starts(job):
    """Not a period later: a rank frozen within its first period of training (fast first steps) had no heartbeat, and
    was named as a rank that never reached training, its host "?" (tests/container/test_reliability.py's frozen host)."""
    wd = job.rank(1)
    wd.judge.stopping.set()  # the thread ends at its first wait
    wd.judge.run()
    assert job.store.check([store_link.stored("1")])


def test_rank_zeros_hang_line_ends_with_the_goodput_so_far(job):
    """The hang line, as any failure's, says where the job's time went until then: rank 0's (it has the figures)."""
    wd = job.rank(0)
    attempt = goodput.Attempt(goodput.Ledger(), 0.0, wall=lambda: 100.0)
    attempt.ledger.spent("start-up", 20.0)
    attempt.training, wd.judge.goodput = True, attempt
    steps(wd, 0, 1)
    wd.step_start(None, 2)
    job.advance(LIMIT + 1)
    with pytest.raises(Ended) as ended:
        wd.judge.tick()
    assert "within the training timeout" in ended.value.line
    hang = ended.value.line.partition("; goodput so far ")[0]
    assert hang != ended.value.line == attempt.so_far(hang) and "start-up 20 s" in ended.value.line
