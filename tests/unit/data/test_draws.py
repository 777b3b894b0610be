"""The generators a training step draws from (data/draws.py): seeded, read and set back through a checkpoint loaded
with weights_only=True, held while a validation draws (and set back when it fails); and ResumableDataLoader resumed
from a state_dict taken at any batch draws what the uninterrupted epoch drew, with or without a validation drawing in
between.

    .venv/bin/pytest tests/unit/data/test_draws.py -q
"""

import io
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from sagemaker_lightning.data import draws
from sagemaker_lightning.data.resumable import ResumableDataLoader

pytestmark = pytest.mark.unit


def drawn() -> tuple:
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]


def through_a_checkpoint(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)  # as the runtime's CheckpointIO loads


def test_seed_all_makes_each_generator_repeat_its_draws():
    draws.seed_all(hash((0, 1, 2)))
    first = drawn()
    draws.seed_all(hash((0, 1, 3)))
    other = drawn()
    draws.seed_all(hash((0, 1, 2)))
    assert drawn() == first
    assert all(a != b for a, b in zip(first, other, strict=True))  # each of torch's, numpy's and Python's was reseeded


def test_a_state_set_back_through_a_checkpoint_repeats_every_generators_draws():
    draws.seed_all(5)
    drawn()
    state = through_a_checkpoint(draws.current())
    expected = drawn()
    draws.seed_all(6)
    draws.restore(state)
    assert drawn() == expected
    assert draws.every_rank(state) == [state]  # one process: no collective


def test_a_validation_draws_on_the_side():
    draws.seed_all(7)
    expected = drawn()
    draws.seed_all(7)
    draws.hold()
    held = draws.training()
    drawn()  # the validation's draws
    assert draws.training() is held  # what a save inside the validation writes
    draws.release()
    assert drawn() == expected
    draws.release()  # none held: nothing happens


def epoch(loader, stop_after=None, validate_after=None):
    """(ids, draws) of each batch of epoch 1 and its step, and the state_dict after batch `stop_after`."""
    loader.sampler.set_epoch(1)
    seen, saved = [], None
    for i, batch in enumerate(loader):
        seen.append((batch.tolist(), drawn()))
        if i == validate_after:
            draws.hold()
            drawn()
        if i == stop_after:
            saved = through_a_checkpoint(loader.state_dict())
        if i == validate_after:
            draws.release()
    return seen, saved


def loader():
    data = torch.arange(40)
    return ResumableDataLoader(data, batch_size=4, sampler=DistributedSampler(data, 1, 0, shuffle=True, seed=3))


@pytest.mark.parametrize("stop_after", [0, 4, 8, 9])  # the first batch, mid-epoch, the last but one, the last
@pytest.mark.parametrize("validating", [False, True])  # a validation that draws, and the save inside it
def test_a_resumed_epoch_draws_what_the_uninterrupted_one_drew(stop_after, validating):
    validate_after = stop_after if validating else None
    uninterrupted, state = epoch(loader(), stop_after, validate_after)
    torch.manual_seed(99), np.random.seed(99), random.seed(99)  # whatever ran before the resume
    resumed = loader()
    resumed.load_state_dict(state)
    again, _ = epoch(resumed)
    assert again == uninterrupted[stop_after + 1 :]
    assert sum((ids for ids, _ in uninterrupted), []) != list(range(40))  # shuffled: an order to keep


def test_a_validation_ended_by_an_exception_leaves_training_its_draws_and_nothing_held():
    import lightning.pytorch as pl
    from lightning.pytorch.demos.boring_classes import BoringModel

    from sagemaker_lightning.data.training_loader import TrainingLoader
    from sagemaker_lightning.toolbox.lightning_package import made

    class Failing(BoringModel):
        def validation_step(self, batch, batch_idx):
            self.training_draws = draws.training()
            torch.rand(5)  # the validation's own draws
            raise RuntimeError("validation failed")

    model = Failing()
    trainer = pl.Trainer(
        max_steps=2, val_check_interval=1, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[made(TrainingLoader, pl)()],
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="validation failed"):
        trainer.fit(model)
    assert draws._held is None  # a later fit's save before its first validation writes its own state
    expected = drawn()
    draws.restore(model.training_draws)
    assert drawn() == expected  # the generators are back where training left them
