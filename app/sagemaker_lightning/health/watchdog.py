"""A hang names itself. Once training runs, a collective that does not finish within the training timeout ends the job
on every host in one line that names the operation, the ranks and hosts that did not arrive, and what they were doing:

    python train.py --training_timeout 300    # seconds; null: timeout_s's rule (FLOOR_S, TIMES_MEDIAN below), from
                                              # the first step on (the first step itself is a busy mark)
    torchfrtrace $SM_OUTPUT_DATA_DIR/flight_recorder -p rank_   # the dumps of the ranks that ended (NCCL's; torch
                                                                # 2.14.1's analyser fails on gloo's: pickle.load them)

This is the callback, in the main thread: at the start of training it agrees the job's key with its peers and starts
the judge's thread (judge.py: the heartbeats, the judgement, the line); at each step it marks the progress the judge
reads (the step's time for the derived timeout, the steps done, the first step as a busy mark: it compiles, no hang);
at the end it stops the thread. A few assignments a step; several processes in a job only (plan.in_job).
"""

import statistics
import threading
import time
from collections import deque

from jsonargparse.typing import PositiveFloat

from sagemaker_lightning.health import signing
from sagemaker_lightning.health.heartbeats import PERIOD_S
from sagemaker_lightning.health.judge import Judge, Progress
from sagemaker_lightning.toolbox.concern import Context, Part, Setting, declares
from sagemaker_lightning.toolbox.lightning_package import made
from sagemaker_lightning.toolbox.status import Status

FLOOR_S = 120.0  # a derived timeout is at least this: a slow first batch of an epoch, validation's end, a save
TIMES_MEDIAN = 10  # a derived timeout: this many median steps
UNTIMED = 2  # intervals of a process's start not timed: up to the first batch, and the first step (it compiles and
# warms up: it is a busy mark, no hang, and no measure of the steps after it)
FIRST_STEP = "the first step (compiling, warming up)"  # the busy mark of each rank's first step
TIMEOUT = Setting(
    "training_timeout",
    PositiveFloat | None,
    None,
    f"seconds a collective may take once training runs (null: {TIMES_MEDIAN}x the median step, at least {FLOOR_S:g} s)",
)


def timeout_s(given: float | None, step_seconds: list[float], dist_timeout_s: float) -> float:
    """The training timeout: the user's, else TIMES_MEDIAN median steps timed so far, at least FLOOR_S (with none
    timed yet: FLOOR_S), at most dist_timeout. From the first step on: a hang in the first steps ends after the floor,
    not dist_timeout; the first step itself is a busy mark (Watchdog), however long it compiles."""
    if given is not None:
        return given
    median = statistics.median(step_seconds) if step_seconds else 0.0
    return min(max(FLOOR_S, TIMES_MEDIAN * median), dist_timeout_s)


class Watchdog:
    """The callback: times the training steps in the main thread (a few assignments a step) for the judge, whose
    thread runs from the start of training to its end."""

    BASE = "callbacks.Callback"
    clock = staticmethod(time.monotonic)  # the main thread's progress: the judge's clock too

    def __init__(self, *, given_s, plan, status=None, goodput=None):
        """plan: the job's (dist_timeout, and what the judge needs of it); status: the process's Status (its busy
        mark, ending, spread); goodput: the Attempt whose figures end the line."""
        self.given_s, self.dist_timeout_s, self.plan = given_s, plan.timeout_s, plan
        self.status: Status = status or Status()
        self.goodput = goodput
        self.thread: threading.Thread | None = None

    def on_train_start(self, trainer, pl_module):
        if trainer.world_size == 1:
            return
        key = signing.agree_key(trainer.strategy.root_device)  # a collective: every rank, here
        self.begin(trainer.global_rank, trainer.world_size, trainer.global_step, key)
        self.thread = threading.Thread(target=self.judge.run, name="sagemaker-lightning-watchdog", daemon=True)
        self.thread.start()

    def begin(self, rank: int, world_size: int, step: int, key: bytes) -> None:
        """The steps' timing, and the judge that reads it."""
        self.steps: deque[float] = deque(maxlen=100)  # the latest step times, for the median
        self.untimed = UNTIMED  # intervals not timed yet (UNTIMED)
        self.progress = Progress(beat=self.clock(), step=step)
        self.judge = Judge(
            rank=rank,
            world_size=world_size,
            key=key,
            plan=self.plan,
            progress=self.progress,
            limit=lambda: timeout_s(self.given_s, list(self.steps), self.dist_timeout_s),  # each heartbeat, its thread
            clock=self.clock,
            status=self.status,
            goodput=self.goodput,
        )

    def step_start(self, trainer, batch_idx):  # toolbox/concern.py's Steps calls it, and step_end
        now = self.clock()
        if self.thread:
            if self.untimed:
                self.untimed -= 1
            else:
                self.steps.append(now - self.progress.beat)
            self.progress.beat = now
            if self.untimed == 1 and self.status.doing is None:  # its first step: no hang however long it compiles
                self.status.doing = FIRST_STEP

    def step_end(self, trainer, step, outputs, batch):
        if self.thread:
            self.progress.step = step  # a rank stuck before this step's hooks reports the same one
            self.progress.since_ns = self.progress.since_ns or time.time_ns()
            if self.status.doing == FIRST_STEP:
                self.status.doing = None

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.thread:
            self.progress.beat = self.clock()

    def on_train_end(self, trainer, pl_module):
        self._stop()

    def teardown(self, trainer, pl_module, stage):
        self._stop()

    def _stop(self) -> None:
        if self.thread:
            self.judge.stopping.set()
            self.thread.join(timeout=2 * PERIOD_S)
            self.thread = None


@declares(TIMEOUT)
def concern(ctx: Context) -> Part:
    """The Watchdog in a job: a hang names itself, stragglers show."""
    if not ctx.plan.in_job:
        return Part()
    given_s, made_here = TIMEOUT.of(ctx.config), made(Watchdog, ctx.pl)
    return Part(callbacks=[made_here(given_s=given_s, plan=ctx.plan, status=ctx.status, goodput=ctx.goodput)])
