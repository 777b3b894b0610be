"""Training data that resumes exactly mid-epoch: a restarted job trains on the batches the interrupted one had not
reached yet, in the same order, and skips the ones it had (as indices: they are never loaded).

Lightning saves a training iterable's state_dict() in every checkpoint and hands it back on resume. ResumableEpoch
is that state for any iterable over a DistributedSampler; ResumableDataLoader is a DataLoader with it. A project's
plain DataLoader is made resumable by `resumable` (the runtime's LightningCLI does it for the training loader);
a loader that already has a state_dict is the project's own and is left as it is.

    python -c "from sagemaker_lightning.resumable import ResumableDataLoader; help(ResumableDataLoader)"
"""

import inspect
import itertools
import os

from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler


class ResumableEpoch:
    """A training iterable that resumes mid-epoch where a checkpoint left it. Lightning saves its state_dict() in
    each checkpoint and gives it back on resume; the next epoch iterated then skips the batches already trained on.
    The order is the same: the sampler's permutation depends only on its seed and epoch. Handed out means trained
    on: Lightning takes no batches ahead from an iterable whose length it knows."""

    sampler: DistributedSampler
    _skip_next = 0  # batches to skip in the next epoch iterated: set by load_state_dict
    _handed_out = 0  # batches handed out in the current epoch

    def state_dict(self) -> dict:
        return {"epoch": self.sampler.epoch, "batches": self._handed_out}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.set_epoch(state["epoch"])
        self._skip_next = state["batches"]

    def _start_epoch(self) -> int:
        """How many batches this epoch skips (0 but right after a resume)."""
        skip, self._skip_next = self._skip_next, 0
        self._handed_out = skip
        return skip

    def _hand_out(self, batch):
        self._handed_out += 1
        return batch


class SkipFirst:
    """A batch sampler that leaves out the first `n` batches of its first iteration only (persistent DataLoader
    workers keep iterating the same batch sampler epoch after epoch)."""

    def __init__(self, batches, n: int):
        self.batches, self.n = batches, n

    def __len__(self) -> int:
        return len(self.batches) - self.n

    def __iter__(self):
        n, self.n = self.n, 0
        return itertools.islice(iter(self.batches), n, None)


class ResumableDataLoader(ResumableEpoch, DataLoader):
    """A DataLoader that resumes mid-epoch: the batches already trained on are skipped as indices, never loaded."""

    _skipping = 0

    @property
    def _index_sampler(self):
        batches = super()._index_sampler
        return SkipFirst(batches, self._skipping) if self._skipping else batches

    def __iter__(self):
        self._skipping = self._start_epoch()
        iterator = super().__iter__()  # takes _index_sampler now
        self._skipping = 0
        return map(self._hand_out, iterator)


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


def make_training_loader_resumable(owner, trainer, overridden) -> None:
    """From now on `owner`'s (the data module's, or the model's) train_dataloader() returns a resumable loader, when
    `owner` defines one (`overridden`: Lightning's is_overridden)."""
    if owner is None or not overridden("train_dataloader", owner):
        return
    provide = owner.train_dataloader

    def train_dataloader():
        return resumable(provide(), trainer.global_rank, trainer.world_size)

    owner.train_dataloader = train_dataloader
