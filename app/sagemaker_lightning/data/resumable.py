"""Training data that resumes exactly mid-epoch: a restarted job trains on the batches the interrupted one had not
reached yet, in the same order, and skips the ones it had (as indices: they are never loaded).

Lightning saves a training iterable's state_dict() in every checkpoint and hands it back on resume. ResumableEpoch
is that state for any iterable over a DistributedSampler; ResumableDataLoader is a DataLoader with it. A project's
plain DataLoader is made resumable by `resumable` (in a job, for the training loader: training_loader.py); a loader
that already has a state_dict is the project's own and is left as it is.

    python -c "from sagemaker_lightning import ResumableDataLoader; help(ResumableDataLoader)"
"""

import inspect
import itertools
import math
import os
from collections.abc import Callable, Iterator

from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

from sagemaker_lightning.data import draws
from sagemaker_lightning.lines import say


class ResumableEpoch:
    """A training iterable that resumes mid-epoch where a checkpoint left it. Lightning saves its state_dict() in
    each checkpoint and gives it back on resume; the epoch it then continues skips the batches already trained on.
    The order is the same: the sampler's permutation depends only on its seed and epoch. Handed out means trained
    on: Lightning takes no batches ahead from an iterable whose length it knows.

    Which epoch continues is Lightning's to say (it sets the sampler's epoch when an epoch starts): a checkpoint
    written on an epoch's last batch, or during the validation after it, holds an epoch whose batches all ran, which
    Lightning counts as done; the next epoch then starts whole. The position saved is always the sampler's epoch's:
    a checkpoint written once Lightning has set the next epoch but before its first batch (a stop agreed at its first
    step) holds none of its batches, not the count of the epoch before; one written by a resumed run before its first
    batch holds the position it resumed at.

    The random-number generators (draws.py) are seeded from the sampler's seed and the epoch before an epoch's first
    batch, and each checkpoint holds every rank's state with the position: a resumed run sets its rank's back before
    its first batch, so what the batches and their steps draw (augmentation in this process, dropout) is the same as
    in the uninterrupted run, wherever the checkpoint was written. A validation draws on a held state wherever the
    runtime wraps the training loader (training_loader.py), so whether a resumed run repeats one does not matter.
    Seeding before every batch did the same at a cost of about 5 % of a negligible step (docs/performance.md)."""

    sampler: DistributedSampler
    batch_size: int
    drop_last = False  # a DataLoader's own: its last incomplete batch dropped
    _resume: tuple[int, int] | None = None  # (epoch, batches handed out) from the checkpoint: set by load_state_dict
    resumed: tuple[int, int] | None = None  # (epoch, batches of this shape) after a resume with another shape
    _counted: tuple[int, int] | list[int] = (-1, 0)  # (epoch, batches handed out in it) of the epoch iterated last
    _drawn: dict | None = None  # this rank's generators as the checkpoint left them, until its first batch sets them

    def shape(self) -> dict:
        """What a position in the epoch is counted in, saved with it: a resume with another compares them."""
        sampler = self.sampler
        drop = bool(self.drop_last or sampler.drop_last)
        return {"batch size": int(self.batch_size), "world size": sampler.num_replicas, "seed": sampler.seed,
                "shuffle": bool(sampler.shuffle), "drop_last": drop}  # fmt: skip

    def _resumed_at(self) -> int:
        """Batches of the sampler's epoch that the checkpoint resumed from had handed out, else 0."""
        return self._resume[1] if self._resume and self._resume[0] == self.sampler.epoch else 0

    def _position(self) -> tuple[int, int]:
        """(epoch, batches of it trained on): the checkpoint's own until its epoch's first batch (nothing is trained
        before it, and Lightning may not have set the sampler's epoch yet); then the batches handed out in the
        sampler's epoch, none in an epoch not iterated yet (the sampler is set before its first batch is asked for)."""
        if self._resume:
            return self._resume
        epoch = self.sampler.epoch
        return epoch, self._counted[1] if self._counted[0] == epoch else 0

    def state_dict(self) -> dict:
        shape, (epoch, batches) = self.shape(), self._position()
        samples = batches * shape["batch size"] * shape["world size"]  # of the epoch's order, every rank's
        drawn = draws.every_rank(self._drawn if self._drawn is not None else draws.training())
        return {"epoch": epoch, "batches": batches, "samples": samples, "shape": shape, "draws": drawn}

    def load_state_dict(self, state: dict) -> None:
        was, now = state.get("shape"), self.shape()  # none: saved before shapes were (same shape assumed)
        if was is None or was == now:
            self._resume = (state["epoch"], state["batches"])
            drawn = state.get("draws") or []  # none: saved before the states were
            self._drawn = drawn[self.sampler.rank] if len(drawn) == now["world size"] else None
            return
        total = len(self.sampler) * now["world size"]  # the epoch's order, every rank's
        at, line = continued(state["epoch"], was, now, state["samples"], total)
        self._resume = self.resumed = (state["epoch"], at // (now["batch size"] * now["world size"]))
        if self.sampler.rank == 0:
            say(line)

    def _epoch(self, batches: Callable[[int], Iterator]) -> Iterator:
        """This epoch's batches, `batches(skip)` giving them from the first not skipped. Made when the first one is
        asked for, not at iter(): on resume Lightning calls iter() before it sets the epoch."""
        epoch, (start, self._resume) = self.sampler.epoch, (self._resumed_at(), None)
        drawn, self._drawn = self._drawn if start else None, None
        # one attribute set an epoch, then counted in place: a DataLoader's __setattr__ is Python's, a cost at each step
        self._counted = counted = [epoch, start]
        iterator = batches(start)
        if drawn is None:  # an epoch's first batch; or a checkpoint without this rank's state (older, or another shape)
            draws.seed_all(hash((self.sampler.seed, epoch, start)))
        else:
            draws.restore(drawn)
        for handed_out in itertools.count(start):
            try:
                batch = next(iterator)
            except StopIteration:
                return
            counted[1] = handed_out + 1
            yield batch


def continued(
    epoch: int,
    was: dict,
    now: dict,
    samples: int,
    total: float = math.inf,
    ordered: tuple[str, ...] = ("seed", "shuffle"),
):
    """Where an epoch saved `samples` into its order with shape `was` continues with shape `now`: the first sample of
    the batch of the new shape that holds it (a batch is every rank's), and the one line saying so. Exact where the
    new batches divide the samples done; else they are trained again. `total`: the epoch's samples, every rank's, where
    `samples` counts a partial last batch whole (batches × batch size): the line counts the samples it holds.
    `ordered`: the settings that make the order."""
    stride = max(1, now["batch size"] * now["world size"])
    at = samples - samples % stride
    samples, said = min(samples, total), min(at, total)  # the line's: no sample past the epoch's end
    changed = ", ".join(f"{k} {now[k]} (was {was.get(k)})" for k in now if was.get(k) != now[k])
    if any(was.get(k) != now[k] for k in ordered):
        what = "the epoch's order is another, so which of its samples were trained is not known: it continues at "
        what += f"sample {said} of the new order"
    elif said == samples:
        what = f"the epoch continues exactly at sample {said}"
    else:
        what = f"the epoch restarts at sample {said} ({samples - said} samples trained again)"
    return at, f"resumed epoch {epoch} with {changed}: {what}"


class SkipFirst:
    """A loader's batch sampler less its first `loader._skipping` batches, read at each iteration: a DataLoader
    iterator iterates its batch sampler twice when it starts worker processes, and persistent workers' iterator
    again at each epoch."""

    def __init__(self, loader: "ResumableDataLoader", batches):
        self.loader, self.batches = loader, batches

    def __len__(self) -> int:
        return len(self.batches) - self.loader._skipping

    def __iter__(self):
        return itertools.islice(iter(self.batches), self.loader._skipping, None)


class ResumableDataLoader(ResumableEpoch, DataLoader):
    """A DataLoader that resumes mid-epoch: the batches already trained on are skipped as indices, never loaded."""

    _skipping = 0  # batches the iterator made now leaves out

    @property
    def _index_sampler(self):
        return SkipFirst(self, super()._index_sampler)

    def __iter__(self):
        return self._epoch(self._skipping_first)

    def _skipping_first(self, n: int) -> Iterator:
        self._skipping = n
        try:
            return super().__iter__()  # iterates _index_sampler now
        finally:
            self._skipping = 0


SAMPLING = ("self", "dataset", "shuffle", "sampler", "batch_sampler")  # replaced by the resumable sampler


def resumable(loader, rank: int, world_size: int):
    """`loader` made resumable, when it is a plain DataLoader over a map-style dataset with a random or sequential
    sampler (or a DistributedSampler); anything else as it is. The shuffle becomes DistributedSampler's: one seeded
    permutation per epoch (seed: seed_everything's), this process taking every world_size-th index from its rank."""
    if not isinstance(loader, DataLoader) or hasattr(loader, "state_dict") or loader.batch_size is None:
        return loader
    sampler = loader.sampler
    if not isinstance(sampler, DistributedSampler):
        if not isinstance(sampler, (RandomSampler, SequentialSampler)):
            return loader
        seed = int(os.environ.get("PL_GLOBAL_SEED", 0))  # set by seed_everything, as Lightning's own samplers read it
        shuffle = isinstance(sampler, RandomSampler)
        sampler = DistributedSampler(
            loader.dataset, world_size, rank, shuffle=shuffle, seed=seed, drop_last=loader.drop_last
        )
    # DataLoader's own settings, those this torch version has (in_order: 2.6 and later), as the loader holds them
    settings = inspect.signature(DataLoader.__init__).parameters
    kept = {k: getattr(loader, k) for k in settings if k not in SAMPLING and hasattr(loader, k)}
    return ResumableDataLoader(loader.dataset, sampler=sampler, **kept)
