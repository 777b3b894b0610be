"""The interruption oracle's matrix: where a signal comes (BOUNDARIES), which signals (INTERRUPTIONS), and the
cases: every boundary × every interruption on the default pipeline and 2 processes, the other dimensions (PIPELINES,
TOPOLOGIES, PACES) pairwise, and resumes with another shape (RESHAPES). `matrix` writes docs/resume-matrix.md.

    .venv/bin/python tests/plugins/oracle/cases.py > docs/resume-matrix.md
"""

import dataclasses
import itertools
import sys

from oracle.project import IDS
from oracle.rank import Fault, Pipeline

# the stop agreement's interval (StopTogether.AGREE_EVERY_S, 0.25 s): far shorter than a step of the job (about a
# millisecond), so every step agrees ("slow steps", as a real model's), or far longer (an agreement every MOST_STEPS)
SLOW, FAST = 1e-6, 1e3


@dataclasses.dataclass(frozen=True)
class Boundary:
    """Where a signal comes: a Fault's place and moment; `step`: a step, or a function of the steps in an epoch."""

    what: str
    where: str
    step: object = None
    epoch: int | None = None
    batch: int | None = None
    sanity: bool = False
    validating: bool | None = None

    def fault(self, action: str, per_epoch: int) -> Fault:
        step = self.step(per_epoch) if callable(self.step) else self.step
        return Fault(action, self.where, step, self.epoch, self.batch, self.sanity, self.validating)


# The job (rank.SETTINGS): 2 epochs of 16 ids, 2 a batch on each rank (4 steps an epoch on 2 ranks, 8 on one), a
# validation every 2 steps and at each epoch's end, last.ckpt every 3 steps (its write at step 3 in flight)
BOUNDARIES = {
    "first-step": Boundary("the first step's start", "on_train_batch_start", 0),
    "step-start": Boundary("a step's start", "on_train_batch_start", 1),
    "step-end": Boundary("a step's end", "on_train_batch_end", 2),
    "last-step": Boundary("an epoch's last step", "on_train_batch_start", lambda n: n - 1),
    "next-first-step": Boundary("the next epoch's first step", "on_train_batch_start", lambda n: n),
    "epoch-start-hooks": Boundary("the next epoch's start hooks", "on_train_epoch_start", epoch=1),
    "epoch-end-hooks": Boundary("an epoch's end hooks", "on_train_epoch_end", epoch=0),
    "epoch-end-save": Boundary("the epoch-end save", "on_save_checkpoint", lambda n: n, validating=False),
    "last-epoch-end": Boundary("the last epoch's end hooks", "on_train_epoch_end", epoch=1),
    "val-start-mid": Boundary("a validation's start, mid-epoch", "on_validation_start", 2),
    "val-middle-mid": Boundary("a validation's middle, mid-epoch", "on_validation_batch_end", 2, batch=0),
    "val-end-mid": Boundary("a validation's end, mid-epoch", "on_validation_end", 2),
    "val-start-end": Boundary("a validation's start, epoch end", "on_validation_start", lambda n: n),
    "val-middle-end": Boundary("a validation's middle, epoch end", "on_validation_batch_end", lambda n: n, batch=0),
    "val-end-end": Boundary("a validation's end, epoch end", "on_validation_end", lambda n: n),
    "save-in-flight": Boundary("a background save in flight", "write", 3),
    "sanity-check": Boundary("the sanity check", "on_validation_batch_start", 0, sanity=True),
    "before-agreement": Boundary("just before an agreement's all-reduce", "before agreement", 1),
    "after-agreement": Boundary("just after an agreement's all-reduce", "after agreement", 1),
}


@dataclasses.dataclass(frozen=True)
class Interruption:
    what: str
    signals: tuple[tuple[int, str], ...]  # (rank, action) of the first run's signals
    again: bool = False  # a second SIGTERM, to every rank, as the resumed run starts (before its first step)

    @property
    def sigterm(self) -> bool:
        return self.signals[0][1] == "SIGTERM"


INTERRUPTIONS = {
    "sigterm-one": Interruption("SIGTERM to one rank", ((1, "SIGTERM"),)),
    "sigterm-every": Interruption("SIGTERM to every rank, each as it gets there", ((0, "SIGTERM"), (1, "SIGTERM"))),
    "sigkill-one": Interruption("SIGKILL of one rank", ((0, "SIGKILL"),)),
    "sigkill-every": Interruption("SIGKILL of every rank at once", ((0, "SIGKILL all"), (1, "SIGKILL all"))),
    "sigterm-twice": Interruption("SIGTERM, then again as the resumed run starts", ((1, "SIGTERM"),), again=True),
}
AGAIN = Fault("SIGTERM", "on_train_start")
TOPOLOGIES = {"1-process": 1, "2-processes": 2, "2-hosts": 2}  # → world size
PACES = {"slow": SLOW, "fast": FAST}
# the shape a resumed run has instead of the interrupted one's (batch size, or topology): (what, arguments, topology)
RESHAPES = {
    "batch-4": ("a batch of 4 on each rank (the samples done divide)", ("--data.batch_size=4",), None),
    "batch-3": ("a batch of 3 on each rank (they do not)", ("--data.batch_size=3",), None),
    "one-process": ("one process instead of two", (), "1-process"),
}


def pipelines(archive: str, streamed: str) -> dict[str, Pipeline]:
    """`archive`: a CIFAR-10 archive of IDS training and VAL_IDS test images; `streamed`: runs.streamed_ids' folder."""
    user, images = (
        ("--data.batch_size=2",),
        (f"--data.data_dir={archive}", "--data.val_split=0", "--model.features=3072"),
    )
    return {
        "device-resident": Pipeline("pytorch_lightning", "DeviceIds", (*user, *images)),  # the example's
        "example-dataloader": Pipeline("pytorch_lightning", "ExampleIds", (*user, *images, "--data.num_workers=2")),
        "dataloader": Pipeline("lightning.pytorch", "UserData", user),
        "dataloader-workers": Pipeline("lightning.pytorch", "UserData", (*user, "--data.num_workers=2")),
        "iterable": Pipeline("lightning.pytorch", "UserData", (*user, "--data.iterable=true")),
        "streamed": Pipeline("lightning.pytorch", "StreamedData", (*user, f"--data.data_dir={streamed}")),
        "fsdp": Pipeline("lightning.pytorch", "UserData", (*user, "--trainer.strategy=fsdp")),
    }


PIPELINES = list(pipelines("", ""))
NOT_RESUMABLE = ("iterable",)  # a resume mid-epoch starts its epoch again, and says so


@dataclasses.dataclass(frozen=True)
class Case:
    boundary: str
    interruption: str
    pipeline: str = "device-resident"
    topology: str = "2-processes"
    pace: str = "slow"
    reshape: str | None = None  # the resumed runs' shape (RESHAPES)

    @property
    def id(self) -> str:
        parts = (self.boundary, self.interruption, self.pipeline, self.topology, self.pace, self.reshape)
        return "/".join(p for p in parts if p)

    @property
    def world(self) -> int:
        return TOPOLOGIES[self.topology]

    @property
    def per_epoch(self) -> int:
        return IDS // (2 * self.world)  # steps: 2 samples a batch on each rank

    def faults(self) -> tuple[tuple[int, Fault], ...]:
        signals = INTERRUPTIONS[self.interruption].signals[: self.world]  # one rank: "one" and "every" are the same
        boundary = BOUNDARIES[self.boundary]
        if boundary.where == "write" and self.pipeline != "fsdp":  # rank 0 writes every whole file
            signals = [(0, action) for _, action in signals[:1]]
        return tuple((min(r, self.world - 1), boundary.fault(a, self.per_epoch)) for r, a in signals)


def valid(case: Case) -> bool:
    """One process has no "every rank" apart from "one rank", and no stop agreement (Lightning's own handler); a run
    resumed at the last epoch's end has nothing left to train, nothing to interrupt again."""
    if case.interruption == "sigterm-twice" and case.boundary == "last-epoch-end":
        return False
    return case.world > 1 or not ("every" in case.interruption or case.boundary.endswith("agreement"))


def full() -> list[Case]:
    """Every boundary × every interruption: the device-resident pipeline, 2 processes, an agreement at every step."""
    return [case for b in BOUNDARIES for i in INTERRUPTIONS if valid(case := Case(b, i))]


def pairwise() -> list[Case]:
    """Every pair of values of pipeline, topology, pace and interruption in some case (greedily: each next case the
    one that covers most pairs not yet covered), the boundaries taken in turn."""
    dimensions = (PIPELINES, list(TOPOLOGIES), list(PACES), list(INTERRUPTIONS))
    possible = [v for v in itertools.product(*dimensions) if valid(Case("", v[3], *v[:3]))]

    def pairs(v):
        return {(i, v[i], j, v[j]) for i, j in itertools.combinations(range(len(v)), 2)}

    wanted, boundaries, chosen = set().union(*map(pairs, possible)), itertools.cycle(BOUNDARIES), []
    while wanted:
        best = max(possible, key=lambda v: len(pairs(v) & wanted))
        wanted -= pairs(best)
        chosen.append(next(c for b in boundaries if valid(c := Case(b, best[3], *best[:3]))))
    return chosen


# where a loader's count crosses an epoch's end: a stop agreed after the end hooks (between epochs), in the last step
EDGES = ("epoch-end-hooks", "last-step")


def edges() -> list[Case]:
    """Every pipeline, SIGTERM to one rank at each of EDGES: pairwise meets no boundary with each pipeline."""
    return [Case(b, "sigterm-one", p) for p in PIPELINES for b in EDGES]


def reshaped() -> list[Case]:
    """A SIGTERM after step 2 (8 samples of the epoch done on 2 ranks), resumed in each of RESHAPES."""
    return [Case("step-end", "sigterm-one", "dataloader", reshape=r) for r in RESHAPES]


def cases() -> list[Case]:
    return list(dict.fromkeys(full() + pairwise() + edges() + reshaped()))


def matrix() -> str:
    """docs/resume-matrix.md, made from the cases; a unit test holds the file to it."""
    rows = ["| boundary | " + " | ".join(i.what for i in INTERRUPTIONS.values()) + " |", "|---" * 6 + "|"]
    done = set(full())
    for key, boundary in BOUNDARIES.items():
        marks = ("✓" if Case(key, i) in done else "—" for i in INTERRUPTIONS)
        rows.append(f"| {boundary.what} | " + " | ".join(marks) + " |")
    others = ["| pipeline | topology | steps | interruption | boundary |", "|---|---|---|---|---|"]
    for c in dict.fromkeys(pairwise()):
        others.append(
            f"| {c.pipeline} | {c.topology} | {c.pace} | {INTERRUPTIONS[c.interruption].what} | {BOUNDARIES[c.boundary].what} |"
        )
    shapes = [f"| {RESHAPES[c.reshape][0]} |" for c in reshaped()]
    edge = ", ".join(BOUNDARIES[b].what for b in EDGES)
    return MATRIX.format(
        count=len(cases()), full="\n".join(rows), pairwise="\n".join(others), edges=edge, reshaped="\n".join(shapes)
    )


MATRIX = """# The resume matrix

Generated from the interruption oracle's cases (`python tests/plugins/oracle/cases.py > docs/resume-matrix.md`);
`tests/toolkit/test_resume_oracle.py` runs each of its {count} cases on every CI run. A case runs the oracle's small
job (16 ids an epoch, 2 epochs, a validation every 2 steps and at each epoch's end, `last.ckpt` every 3 steps) once
uninterrupted, then interrupted where the row says and resumed until it ends, every rank a real process (a SIGKILL
is one), and holds the chain to the uninterrupted run: every step trains the same sample ids with the same loss on
every rank, each id once an epoch, every validation runs, the same final weights (`torch.equal`); after a SIGTERM
every rank ends stopped (exit 143), no step or validation runs twice, the stop comes at the first step the ranks
agree at after the signal (with slow steps every step agrees), and no epoch starts after it. Where a resume cannot
be exact (a loader that cannot resume mid-epoch, a shape that does not divide the samples done), the job must say
so in one line, and the samples the line names as trained again must be exactly those trained twice.

## Every boundary × every interruption

The example's device-resident pipeline, 2 processes on one host (torchrun's variables), steps slower than the stop
agreement's interval (an agreement at every step); "—": no such case (the resumed run has nothing left to train).

{full}

## The other dimensions, pairwise

Every pair of values of pipeline, topology (one process; 2 processes under torchrun; 2 hosts of one process each,
SageMaker's variables), pace (fast steps: an agreement every many steps) and interruption meets in some case; the
boundaries are taken in turn.

{pairwise}

## Every pipeline at the epoch's edges

Each pipeline on 2 processes, SIGTERM to one rank at each of: {edges}. A stop there is agreed after the epoch's end
hooks or at the next epoch's first step, where a loader's count of its epoch crosses the epoch's end.

## Another shape on resume

A user's DataLoader on 2 processes, SIGTERM after step 2 (8 samples of the epoch done), resumed with:

| the resumed run's shape |
|---|
{reshaped}
"""


if __name__ == "__main__":
    sys.stdout.write(matrix())
