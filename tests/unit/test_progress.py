"""The plain progress lines of a run without a terminal (progress.LogLines): after the first step, then by
time as well as every log_every_n_steps, with an ETA from the first line; SageMaker's metric definitions read them.
A batch of any structure is counted, and a step that returns no loss shows none.

    .venv/bin/pytest tests/unit/test_progress.py
"""

import dataclasses
import re
import sys

import pytest
import pytorch_lightning
import torch
from pytorch_lightning.demos.boring_classes import BoringModel
from torch.utils.data import DataLoader, TensorDataset

from sagemaker_lightning import lines, progress
from sagemaker_lightning.lines import METRICS
from sagemaker_lightning.progress import LogLines
from sagemaker_lightning.toolbox.concern import Steps
from sagemaker_lightning.toolbox.lightning_package import made

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


def stepped(lines: LogLines) -> list:
    """LogLines with the Steps that calls its step_end, as the hub lists them (toolbox/concern.py)."""
    return [lines, made(Steps, pytorch_lightning)([lines])]


def fit(model, clock: Clock, capsys, max_steps: int = 8) -> list[str]:
    """The progress lines of a fit of `model` (a line every 30 s of `clock`, and every 5 steps)."""
    trainer = pytorch_lightning.Trainer(
        max_steps=max_steps,
        log_every_n_steps=5,
        callbacks=stepped(made(LogLines, pytorch_lightning)(every_s=30, clock=clock)),
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,  # as without a terminal
        enable_model_summary=False,
    )
    trainer.fit(model)
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]


def test_lines_come_after_the_first_step_then_by_time_and_by_steps(capsys):
    clock = Clock()
    lines = fit(SlowSteps(clock), clock, capsys)
    steps = [int(re.match(r"epoch 0 step (\d+)/8: ", line)[1]) for line in lines]
    # 1: the first step; 4: 33 s after step 1; 5: log_every_n_steps; 8: 33 s after step 5
    assert steps == [1, 4, 5, 8], lines
    assert lines[0].endswith(f"images/s={4 / STEP_S:.1f} eta=0:01:17")  # 7 steps to go at 11 s each
    for regex in (METRICS["train:loss"], METRICS["train:images_per_second"]):
        assert all(re.search(regex, line) for line in lines)


@dataclasses.dataclass
class Pair:
    x: torch.Tensor
    y: torch.Tensor


class Opaque:
    """A batch of a type no walk knows (a graph library's, say): counted as one batch."""

    def __init__(self, x: torch.Tensor):
        self.x = x


def dicts(samples: list) -> dict:
    return {"x": torch.stack([x for x, _ in samples]), "y": torch.stack([y for _, y in samples])}


class Projects(SlowSteps):
    """SlowSteps in the forms common projects take: the batch a dict or an unknown object; the step returns
    None (a skipped batch), or optimizes by hand (manual optimization) and returns nothing."""

    def __init__(self, clock: Clock, batch: str = "tuple", step: str = "loss"):
        super().__init__(clock)
        self.batch, self.kind = batch, step
        self.automatic_optimization = step != "manual"

    def training_step(self, batch, batch_idx):
        self.clock.now += STEP_S
        x = {"tuple": lambda: batch[0], "dict": lambda: batch["x"], "opaque": lambda: batch.x}[self.batch]()
        loss = self.step(x)
        if self.kind == "manual":
            self.optimizers().zero_grad()
            self.manual_backward(loss)
            self.optimizers().step()
        return {"loss": loss} if self.kind == "loss" else None

    def train_dataloader(self):
        collate = {"tuple": None, "dict": dicts, "opaque": lambda samples: Opaque(dicts(samples)["x"])}[self.batch]
        return DataLoader(TensorDataset(torch.randn(64, 32), torch.zeros(64)), batch_size=4, collate_fn=collate)


@pytest.mark.parametrize(
    ("batch", "step", "shown"),
    [
        ("dict", "loss", rf"train/loss=[0-9.]+ images/s={4 / STEP_S:.1f} "),
        ("opaque", "loss", rf"train/loss=[0-9.]+ batches/s={1 / STEP_S:.1f} "),  # no tensor to count: batches
        ("tuple", "none", rf": images/s={4 / STEP_S:.1f} "),  # no loss: none shown
        ("tuple", "manual", rf": images/s={4 / STEP_S:.1f} "),
    ],
)
def test_lines_for_any_batch_and_any_step(batch, step, shown, capsys):
    """Common projects' batches and steps, which made the line raise at the first step (KeyError: 0 for a dict
    batch; no outputs["loss"] without a returned loss): the fit runs, and every line counts what it can."""
    clock = Clock()
    lines = fit(Projects(clock, batch, step), clock, capsys, max_steps=5)
    assert [int(re.match(r"epoch 0 step (\d+)/5: ", line)[1]) for line in lines] == [1, 4, 5], lines
    assert all(re.search(shown, line) for line in lines), lines


def test_a_batch_counts_the_first_dimension_of_its_first_tensor():
    x = torch.zeros(3, 2)
    assert progress.batch_size(x) == 3
    assert progress.batch_size({"ids": [torch.zeros(5)], "x": x}) == 5  # depth first, in order
    assert progress.batch_size(("names", Pair(x, torch.zeros(7)))) == 3  # a dataclass's fields, in order
    assert progress.batch_size([torch.tensor(1.0), x]) == 3  # a scalar has no first dimension
    for unknown in (Opaque(x), ["a", "b"], {}, None, Pair):  # Pair: the class, not an instance
        assert progress.batch_size(unknown) is None


def test_the_loss_is_a_tensor_or_a_dicts_loss_else_none():
    assert progress.loss(torch.tensor(0.5)) == 0.5
    assert progress.loss({"loss": torch.tensor([0.25]), "acc": 1}) == 0.25
    for none in (None, {}, {"acc": torch.tensor(1.0)}, torch.zeros(2), {"loss": None}, "0.5"):
        assert progress.loss(none) is None


@pytest.mark.parametrize(
    "total, step, expected",
    [
        (8, 1, "0:01:17"),  # 7 steps to go at 11 s each
        (8, 8, "0:00:00"),
        (8, 9, "0:00:00"),  # a step past the total: nothing left, not a negative time
        (0, 1, "0:00:00"),
        (-1, 1, "?"),  # not a count
        (float("inf"), 1, "?"),  # Lightning's total of an endless fit
        (float("nan"), 1, "?"),
        (sys.maxsize, 1, "?"),  # max_steps=sys.maxsize with an iterable loader: beyond timedelta (OverflowError)
        pytest.param(10**400, 1, "?", id="10**400"),  # beyond a float
    ],
)
def test_the_eta_never_raises_whatever_the_totals(total, step, expected):
    """Issue 48, item 7: the progress line's arithmetic never raises, whatever the totals."""
    assert progress.eta(total, step, STEP_S) == expected


def test_a_fit_of_sys_maxsize_steps_on_an_iterable_loader_prints_its_lines(capsys):
    """Issue 48, item 7: trainer.max_steps=sys.maxsize with an iterable loader (Lightning's total is then max_steps)
    crashed rank 0 at the first line with OverflowError; plain Lightning trains, and so does the runtime."""

    class Endless(SlowSteps):
        def train_dataloader(self):
            return DataLoader(IterableBatches(), batch_size=None)

    clock = Clock()
    trainer = pytorch_lightning.Trainer(
        max_steps=sys.maxsize, max_epochs=1, log_every_n_steps=1, accelerator="cpu", logger=False,
        callbacks=stepped(made(LogLines, pytorch_lightning)(every_s=30, clock=clock)), enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Endless(clock))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]
    assert len(lines) == 3 and all(line.endswith(" eta=?") for line in lines), lines
    assert lines[0].startswith(f"epoch 0 step 1/{sys.maxsize}: ")


class IterableBatches(torch.utils.data.IterableDataset):
    """Three (x, y) batches of 4, without a length: Lightning cannot count the epoch's steps."""

    def __iter__(self):
        return iter([(torch.randn(4, 32), torch.zeros(4)) for _ in range(3)])


VALIDATION = "epoch 0 step 2: val/acc=0.5000 val/loss=0.6931"  # lines.validation's


@pytest.mark.parametrize(
    "objective, said, after_the_first_validation",
    [
        ("validation:accuracy", "tuning objective: validation:accuracy, read from the validation line", None),
        ("validation:loss", "tuning objective: validation:loss, read from the validation line", None),
        ("train:loss", "tuning objective: train:loss, read from the progress lines", None),
        ("validation:f1", "tuning objective: validation:f1, read from the validation line",
         "warning: tuning objective validation:f1 is not a metric this job prints: val/f1="),
        ("mine:x", "warning: tuning objective mine:x is not a metric this job prints (the runtime's: train:loss", None),
        ("validation:f 1", "warning: tuning objective validation:f 1 is not a metric this job prints (", None),
    ],
)  # fmt: skip
def test_a_tuning_childs_objective_is_named_and_a_metric_the_job_does_not_print_said(
    objective, said, after_the_first_validation
):
    assert lines.objective(objective).startswith(said)
    unprinted = lines.unprinted(objective, VALIDATION)
    assert unprinted is None if after_the_first_validation is None else unprinted.startswith(after_the_first_validation)
