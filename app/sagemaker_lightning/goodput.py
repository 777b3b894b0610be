"""Goodput: where a job's wall time went, summed across its restarts, in one line at its end (lines.goodput), e.g.

    goodput 96.8 %: training 1h02m; start-up 41 s, restore 9 s, checkpoint stall 12 s, steps trained again 0 (0 s),
    data wait 3 s, validation 2m10s, end 4 s

Global rank 0 measures its own timeline, which every rank keeps step with, as contiguous intervals, so the terms add
up to the wall time:
  start-up      from the container's start (PID 1 records it: launch/started.py; elsewhere this process's) to the
                first training step, less what is accounted inside it (a restore, the sanity check's validation)
  restore       reading the checkpoint the job resumes from (checkpoints/io.py accounts it)
  checkpoint stall  what a save holds the training thread for (checkpoints/: last.ckpt, the best checkpoints)
  steps trained again  the steps this attempt trains again because those before it were killed after the last save,
                and their time (goodput_file.py's ledger, written every 30 s, says how far each got)
  data wait     from a step's end to the next one's start, less what is accounted there: the loader's wait and the
                loop's own work (an epoch's end)
  validation    each validation, the sanity check's included
  training      the steps, from their start to their end
  end           from the last step's end to the line: the export, the MLflow run's end, the process group's end
A job's attempts (a spot restart, torchrun's in-job restart) each add their own record: the checkpoint carries the
records of the attempts before it (the callback's state), and the ledger beside the checkpoints (goodput_file.py) the
records of the newest attempt and those before it, as far as each got: the attempts after the last save, however many
were killed there, each from its trainer's setup on (written every 5 s until its first step: one killed in a long
restore counts too; one killed before, in its imports or its process group's rendezvous, does not). The line goes to
the job's log, said after the process group's end (a one-host job on 2 cores: 1.5 s of the interpreter's exit and the
toolkit's report come after it), to its logger and MLflow run (goodput/*, at the fit's end), and, for a job that ends
badly, into its failure line ("goodput so far"). Here the ledger, an attempt's records and the line, no torch; the
callback that keeps the timeline of a fit is goodput_callback.py's.

    python -c "from sagemaker_lightning import goodput as g; print(g.Attempt(g.Ledger(), 0.0, wall=lambda: 60.0).line())"
"""

import contextlib
import functools
import time
import uuid

from sagemaker_lightning import lines
from sagemaker_lightning.lines import say

STATE_KEY = "Goodput"  # its callback's key among a checkpoint's callbacks (goodput_callback.py), Lightning's default
TERMS = ("start-up", "restore", "checkpoint stall", "steps trained again", "data wait", "validation", "training", "end")


class Ledger:
    """This attempt's accounts: seconds by term, the outermost of nested timings counted once."""

    clock = staticmethod(time.monotonic)

    def __init__(self):
        self.seconds = dict.fromkeys(TERMS, 0.0)
        self.total = 0.0  # their sum, kept as they grow: the training step reads it twice
        self.steps_again = 0  # steps trained again
        self._depth = 0

    def spent(self, term: str, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.seconds[term] += seconds
        self.total += seconds

    @contextlib.contextmanager
    def timing(self, term: str):
        """Time the block under `term`, unless an outer timing counts it already (a save inside a restore)."""
        self._depth += 1
        start = self.clock()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.spent(term, self.clock() - start)

    def accounted(self) -> float:
        return self.total


def summed(records: list[dict]) -> tuple[float, dict, int]:
    """(wall seconds, seconds by term, steps trained again) of every attempt's record."""
    wall, terms, again = 0.0, dict.fromkeys(TERMS, 0.0), 0
    for record in records:
        wall += record.get("wall", 0.0)
        again += record.get("steps_again", 0)
        for term in TERMS:
            terms[term] += record.get("seconds", {}).get(term, 0.0)
    return wall, terms, again


def steady(then: float, since: float) -> float:
    """The wall clock: `then` (time.time() at the monotonic clock's `since`) advanced by the monotonic clock."""
    return then + time.monotonic() - since


class Attempt:
    """This attempt's timeline on global rank 0 (module docstring), and the records of the attempts before it."""

    def __init__(self, ledger: Ledger, start: float, *, checkpoint=None, wall=None):
        """checkpoint: the ModelCheckpoint whose directory holds the ledger (its dirpath is known once it is set up);
        wall: the wall clock, by default time.time() now, advanced by the monotonic clock from then on: the terms are
        timed on that clock, so a step of the wall clock (an NTP correction) moves neither the wall time nor a term
        (set back 30 s, it said goodput 142.9 %)."""
        if wall is None:
            wall = functools.partial(steady, time.time(), time.monotonic())  # a partial pickles (ddp_spawn)
        self.ledger, self.start, self.checkpoint, self.wall = ledger, start, checkpoint, wall
        self.id = uuid.uuid4().hex
        self.before: list[dict] = []  # the records of the attempts before this one
        self.known: list[dict] | None = (
            None  # the ledger's records when this attempt began (goodput_callback.Goodput.setup)
        )
        self.again_until = -1  # the step up to which this attempt trains again what a killed one had trained
        self.step = 0  # the highest step this attempt reached
        self.training = False  # whether this attempt has begun its first step: only then is there a goodput to say
        self.ended = (
            None  # the wall clock at its fit's end (goodput_callback.Goodput._finish), where its wall time stops
        )
        self.deferred = False  # its line said by conclude() (the hub's, after the fit), not at the fit's end

    def record(self) -> dict:
        """This attempt's record so far: its wall time (to its fit's end, once ended), its terms, the step it reached;
        before its first step, all its time not accounted is start-up (as the first step will say)."""
        wall, seconds = (self.wall() if self.ended is None else self.ended) - self.start, dict(self.ledger.seconds)
        if not self.training:
            seconds["start-up"] += max(wall - sum(seconds.values()), 0.0)
        return {
            "id": self.id,
            "wall": wall,
            "seconds": seconds,
            "steps_again": self.ledger.steps_again,
            "step": self.step,
        }

    def records(self) -> list[dict]:
        return [*self.before, self.record()]

    def resumed(self, saved: list[dict], resumed_step: int, ledger: list[dict] | None) -> None:
        """The checkpoint's records (the last one: the attempt that saved it, as it was then), and the ledger's: the
        attempts since, as far as each got (the saver's included), where the ledger goes on from that save; with no
        checkpoint's records, every attempt the ledger holds (killed before any save). The steps any of them reached
        beyond the resumed step are trained again."""
        records = list(saved) or list(ledger or [])
        ids = [record.get("id") for record in ledger or []]
        if saved and records[-1].get("id") in ids:  # killed after that save: the saver, then each attempt after it
            records[-1:] = ledger[ids.index(records[-1].get("id")) :]
        reached = max((record.get("step", 0) for record in records), default=0)
        if reached > resumed_step:
            self.again_until = reached
        self.before = records

    def where(self) -> str | None:
        return getattr(self.checkpoint, "dirpath", None)

    def figures(self) -> dict[str, float]:
        """Every attempt's terms so far as metrics (goodput/<term>_s, goodput/percent): the logger's, MLflow's."""
        wall, seconds, _ = summed(self.records())
        figures = {f"goodput/{term.replace(' ', '_').replace('-', '_')}_s": s for term, s in seconds.items()}
        return {**figures, "goodput/percent": lines.percent(wall, seconds)}

    def line(self) -> str:
        """The goodput line of every attempt so far (lines.goodput)."""
        return lines.goodput(*summed(self.records()))

    def conclude(self) -> None:
        """The line of an ended fit, said after what follows it in the process (the teardown hooks, the process
        group's end): that time is the end term's too."""
        if self.deferred and self.ended is not None:
            now = self.wall()
            self.ledger.spent("end", now - self.ended)
            self.ended = now
            say(self.line())

    def so_far(self, line: str) -> str:
        """A failure's `line` (cli/hub.py's, the watchdog's), ending with the goodput so far once this attempt trained.
        It never raises: it is said while the job fails."""
        if not self.training:
            return line
        try:
            return f"{line}; {self.line().replace('goodput', 'goodput so far', 1)}"
        except Exception:  # a figure no check foresaw must not take the failure's own line with it
            return line
