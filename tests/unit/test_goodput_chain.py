"""Goodput across a job's attempts (sagemaker_lightning/goodput.py), in this process with known sleeps: a spot chain
of five attempts, two crashed after their last save, one killed in its restore, one more crashed, the last to its
end; each term holds at least its sleeps and the terms add up to the wall time.

    .venv/bin/pytest tests/unit/test_goodput_chain.py
"""

import os
import time

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from sagemaker_lightning import LightningCLI, goodput, goodput_callback, goodput_file
from sagemaker_lightning.boot import signals
from sagemaker_lightning.launch import started

pytestmark = pytest.mark.unit


class Slow(Dataset):
    """Each item waits DATA_S: the data wait of a step."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        time.sleep(DATA_S)
        return torch.ones(1)


class Sleepy(pl.LightningModule):
    """Known sleeps: STEP_S a step, VALIDATION_S a validation batch, SAVE_S a save, SETUP_S at setup and at a restore;
    fails at FAIL_AT_STEP when given (a crash after its last save), or in its restore (`killed_restoring`)."""

    def __init__(self, fail_at_step: int = 0, killed_restoring: bool = False):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.fail_at_step, self.killed_restoring = fail_at_step, killed_restoring

    def on_load_checkpoint(self, checkpoint):
        time.sleep(SETUP_S)
        if self.killed_restoring:
            raise RuntimeError("killed while it restores")

    def setup(self, stage):
        time.sleep(SETUP_S)

    def training_step(self, batch, batch_idx):
        if self.global_step == self.fail_at_step:
            raise RuntimeError("a crash after the last save")
        time.sleep(STEP_S)
        return (self.w * batch).sum()

    def validation_step(self, batch, batch_idx):
        time.sleep(VALIDATION_S)

    def on_save_checkpoint(self, checkpoint):
        time.sleep(SAVE_S)

    def train_dataloader(self):
        return DataLoader(Slow(), batch_size=1)

    def val_dataloader(self):
        return DataLoader(Slow(), batch_size=1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


DATA_S, STEP_S, VALIDATION_S, SAVE_S, SETUP_S = 0.005, 0.025, 0.01, 0.05, 0.1


def test_a_spot_chain_of_four_interruptions_with_known_sleeps(tmp_path, monkeypatch, capsys):
    """A job on SageMaker, in this process, interrupted four times: after its last save, the first attempt at step 6
    (last.ckpt at step 4), the second at step 10 (at 8); the third killed in its restore (a kill runs no hook: it had
    left no record); the fourth at step 11; the fifth resumes at step 8 and ends at step 12. Each term holds at least its sleeps, and the terms add up to the wall time within 1 % (the issue's
    target)."""
    job = {"SM_HOSTS": '["localhost"]', "SM_CURRENT_HOST": "localhost", "SM_NUM_GPUS": "0"}
    monkeypatch.setattr(os, "environ", {**os.environ, **job, "SM_OUTPUT_DIR": str(tmp_path)})
    monkeypatch.setattr(signals, "RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(goodput_file, "EVERY_S", 0.0)  # the ledger at every step
    args = ["fit", "--trainer.max_steps=12", "--trainer.accelerator=cpu", "--trainer.val_check_interval=4"]
    args += ["--trainer.limit_val_batches=2", "--trainer.num_sanity_val_steps=0", "--trainer.enable_progress_bar=false"]
    args += [f"--checkpoint.dirpath={tmp_path / 'ckpts'}", f"--trainer.default_root_dir={tmp_path}"]
    args += ["--last_checkpoint_every_n_steps=4", "--trainer.precision=32-true", "--trainer.logger=false"]
    monkeypatch.setattr(goodput_file, "STARTING_EVERY_S", 0.02)
    killed = []
    for fail_at, crash in ((6, "a crash after the last save"), (10, "a crash after"), (0, "killed while it restores")):
        os.environ[started.STARTED_AT] = repr(time.time())
        with pytest.raises(RuntimeError, match=crash), monkeypatch.context() as kill:
            if not fail_at:  # a kill runs no hook: the record is the start-up's writes'
                kill.setattr(goodput_callback.Goodput, "on_exception", lambda callback, *_: killed.append(callback))
            model = [f"--model.fail_at_step={fail_at}", f"--model.killed_restoring={not fail_at}"]
            LightningCLI(Sleepy, args=[*args, *model], save_config_callback=None)
    killed[0]._started()  # its process is gone, and its writes with it
    os.environ[started.STARTED_AT] = repr(time.time())
    with pytest.raises(RuntimeError, match="a crash after the last save"):
        LightningCLI(Sleepy, args=[*args, "--model.fail_at_step=11"], save_config_callback=None)
    os.environ[started.STARTED_AT] = repr(began := time.time())
    cli = LightningCLI(Sleepy, args=args, save_config_callback=None)
    assert cli.trainer.global_step == 12 and len(cli.goodput.records()) == 5
    killed = cli.goodput.records()[2]  # killed in its restore: its time is start-up, as far as it got
    assert killed["step"] == 0 and killed["wall"] >= 2 * SETUP_S  # its setup's and its restore's sleeps
    assert sum(killed["seconds"].values()) == pytest.approx(killed["wall"])
    wall, seconds, again = goodput.summed(cli.goodput.records())
    assert again == 2 + 2 + 3 and seconds["steps trained again"] >= 7 * STEP_S  # 5-6, 9-10, 9-11
    assert seconds["training"] >= 12 * STEP_S  # each step once
    assert seconds["start-up"] >= 7 * SETUP_S and seconds["validation"] >= 3 * 2 * VALIDATION_S  # at 4, 8, 12
    assert seconds["checkpoint stall"] >= 3 * SAVE_S  # step 4, 8 and 12
    assert seconds["data wait"] >= (6 + 6 + 3 + 4 - 4) * DATA_S  # each step's batch but each attempt's first
    assert sum(seconds.values()) == pytest.approx(wall, rel=0.01)
    assert cli.goodput.records()[-1]["wall"] <= time.time() - began + 0.1
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("goodput ")]
    assert said == [cli.goodput.line()]
