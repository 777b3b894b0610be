"""A resume with another batch size or world size (issue 48, item 4): the loader's state records the shape it was
saved with, the position is counted in samples, and a resume of another shape continues exactly where the new
batches divide the samples done, or says in one line which samples it trains again. Never silently. litdata's
elastic resume (it rounds down the same way) gets the same line.

    .venv/bin/pytest tests/unit/data/test_reshaped_resume.py -q
"""

import collections

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import Dataset, DistributedSampler

from sagemaker_lightning.data.resumable import ResumableDataLoader, continued
from sagemaker_lightning.data.training_loader import TrainingLoader
from sagemaker_lightning.toolbox.concern import Steps
from sagemaker_lightning.toolbox.lightning_package import made

pytestmark = pytest.mark.unit

IDS = 96  # the project: 96 ids, SIGKILLed after the step-3 save at batch size 16


class Ids(Dataset):
    def __len__(self):
        return IDS

    def __getitem__(self, i):
        return torch.tensor([float(i)])


class Recorder(pl.LightningModule):
    """Trains on nothing: records which ids each step got."""

    def __init__(self, batch_size: int):
        super().__init__()
        self.batch_size, self.w, self.seen = batch_size, torch.nn.Parameter(torch.zeros(1)), []

    def training_step(self, batch, batch_idx):
        self.seen += [int(i) for i in batch.flatten()]
        return (self.w * batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def train_dataloader(self):
        sampler = DistributedSampler(Ids(), num_replicas=1, rank=0, shuffle=True, seed=7)
        return ResumableDataLoader(Ids(), batch_size=self.batch_size, sampler=sampler)


class Killed(Exception):
    pass


class SaveThenKill(pl.Callback):
    """last.ckpt after the 3rd step, then the process ends: as a SIGKILL right after that save."""

    def __init__(self, path):
        self.path = path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 2:
            trainer.save_checkpoint(self.path)
            raise Killed


def fit(batch_size: int, tmp_path, ckpt_path=None) -> Recorder:
    model = Recorder(batch_size)
    killed = [] if ckpt_path else [SaveThenKill(tmp_path / "last.ckpt")]
    trainer = pl.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[loader := made(TrainingLoader, pl)(), made(Steps, pl)([loader]), *killed],
    )  # fmt: skip
    try:
        trainer.fit(model, ckpt_path=ckpt_path)
    except Killed:
        pass
    return model


@pytest.mark.parametrize(
    "after, again, line",
    [
        (8, 0, "resumed epoch 0 with batch size 8 (was 16): the epoch continues exactly at sample 48"),
        (32, 16, "resumed epoch 0 with batch size 32 (was 16): the epoch restarts at sample 32 (16 samples trained"),
        (16, 0, None),  # the same shape: as before
    ],
)
def test_a_resume_with_another_batch_size_trains_every_sample_and_says_what_it_repeats(
    tmp_path, capsys, after, again, line
):
    first = fit(16, tmp_path)  # 3 batches of 16: the first 48 samples of the epoch's order
    capsys.readouterr()
    rest = fit(after, tmp_path, ckpt_path=tmp_path / "last.ckpt")
    said = [text for text in capsys.readouterr().out.splitlines() if text.startswith("resumed epoch")]
    trained = collections.Counter(first.seen + rest.seen)
    assert sorted(trained) == list(range(IDS))  # none never trained (16 -> 32 left 48 ids out: 32 after the fix)
    assert sum(n - 1 for n in trained.values()) == again  # 16 -> 8 trained 24 twice
    assert len(said) == (line is not None) and all(text.startswith(line) for text in said), said


@pytest.mark.parametrize("after", [5, 3])
def test_a_resume_saved_at_an_epochs_partial_last_batch_says_it_trains_nothing_again(capsys, after):
    """Saved at the last batch of a 10-sample epoch of batch size 4 (4, 4 and 2 samples): the epoch resumed with
    batch size 5 or 3 trains nothing again, and its line says so (it said "restarts at sample 10 (2 samples trained
    again)", and "continues exactly at sample 12" of the 10)."""
    ids = list(range(10))

    def loader(batch_size: int) -> ResumableDataLoader:
        sampler = DistributedSampler(ids, num_replicas=1, rank=0, shuffle=False)
        return ResumableDataLoader(ids, batch_size=batch_size, sampler=sampler)

    saved = loader(4)
    assert [len(batch) for batch in saved] == [4, 4, 2]
    resumed = loader(after)
    resumed.load_state_dict(saved.state_dict())
    assert list(resumed) == []
    said = f"resumed epoch 0 with batch size {after} (was 4): the epoch continues exactly at sample 10"
    assert capsys.readouterr().out == said + "\n"


@pytest.mark.parametrize(
    "was, now, samples, expected",
    [
        ({"batch size": 16, "world size": 1}, {"batch size": 16, "world size": 2}, 48, (32, "(16 samples trained again)")),
        ({"batch size": 16, "world size": 2}, {"batch size": 8, "world size": 1}, 96, (96, "continues exactly at sample 96")),
        ({"batch size": 16, "world size": 1}, {"batch size": 64, "world size": 1}, 48, (0, "restarts at sample 0 (48")),
        ({"batch size": 16, "world size": 1}, {"batch size": 16, "world size": 1}, 0, (0, "exactly at sample 0")),
    ],
)  # fmt: skip
def test_the_position_is_counted_in_samples(was, now, samples, expected):
    order = {"seed": 1, "shuffle": True}
    at, line = continued(2, {**was, **order}, {**now, **order}, samples, IDS)
    assert at == expected[0] and expected[1] in line and line.startswith("resumed epoch 2 with ")


def test_another_seed_says_the_order_is_another():
    shape = {"batch size": 16, "world size": 1, "shuffle": True}
    at, line = continued(0, {**shape, "seed": 1}, {**shape, "seed": 2}, 48, IDS)
    assert at == 48 and "seed 2 (was 1): the epoch's order is another" in line


@pytest.mark.parametrize("dirpath", [True, False], ids=["checkpoint.dirpath", "none"])
def test_off_a_job_a_rerun_from_checkpoint_dirpath_gets_the_resumable_loader(tmp_path, dirpath):
    """README's "Off SageMaker" table: with checkpoint.dirpath a rerun resumes from last.ckpt as a job does, the
    training loader's position included (Lightning's own DataLoader restarted the epoch at its first batch); without
    it the loader is the project's own, as with Lightning's CLI."""
    from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

    from sagemaker_lightning import LightningCLI

    args = ["--trainer.max_steps=1", "--trainer.limit_val_batches=0", "--trainer.logger=false"]
    args += ["--trainer.enable_progress_bar=false", "--trainer.accelerator=cpu"]
    args += [f"--checkpoint.dirpath={tmp_path / 'ckpts'}" if dirpath else f"--trainer.default_root_dir={tmp_path}"]
    cli = LightningCLI(BoringModel, BoringDataModule, args=["fit", *args], save_config_callback=None)
    assert isinstance(cli.trainer.train_dataloader, ResumableDataLoader) == dirpath
