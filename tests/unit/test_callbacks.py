"""The plain progress lines of a run without a terminal (progress.LogLines): after the first step, then by
time as well as every log_every_n_steps, with an ETA from the first line; SageMaker's metric definitions read them."""

import re

import pytest
import pytorch_lightning
import torch
from pytorch_lightning.demos.boring_classes import BoringModel
from torch.utils.data import DataLoader, TensorDataset

from sagemaker_lightning.flavor import made
from sagemaker_lightning.lines import METRICS
from sagemaker_lightning.progress import LogLines

pytestmark = pytest.mark.unit

STEP_S = 11.0  # what each fake step takes on the fake clock


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


class SlowSteps(BoringModel):
    """BoringModel on (x, y) batches of 4, each training step taking STEP_S seconds of the clock."""

    def __init__(self, clock: Clock):
        super().__init__()
        self.clock = clock

    def training_step(self, batch, batch_idx):
        self.clock.now += STEP_S
        return super().training_step(batch[0], batch_idx)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(64, 32), torch.zeros(64)), batch_size=4)


def test_lines_come_after_the_first_step_then_by_time_and_by_steps(capsys):
    clock = Clock()
    trainer = pytorch_lightning.Trainer(
        max_steps=8,
        log_every_n_steps=5,
        callbacks=[made(LogLines, pytorch_lightning)(every_s=30, clock=clock)],
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,  # as without a terminal
        enable_model_summary=False,
    )
    trainer.fit(SlowSteps(clock))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]
    steps = [int(re.match(r"epoch 0 step (\d+)/8: ", line)[1]) for line in lines]
    # 1: the first step; 4: 33 s after step 1; 5: log_every_n_steps; 8: 33 s after step 5
    assert steps == [1, 4, 5, 8], lines
    assert lines[0].endswith(f"images/s={4 / STEP_S:.1f} eta=0:01:17")  # 7 steps to go at 11 s each
    for regex in (METRICS["train:loss"], METRICS["train:images_per_second"]):
        assert all(re.search(regex, line) for line in lines)
