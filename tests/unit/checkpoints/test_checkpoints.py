"""Checkpoints a restarted job resumes from: saves that never leave a broken file under the real name, and when
last.ckpt is written."""

import os
import pickle

import fsspec
import pytest
import pytorch_lightning
import torch
from pytorch_lightning.demos.boring_classes import BoringModel
from torch.utils.data import DataLoader, TensorDataset

from sagemaker_lightning.checkpoints import atomic, interval, resume
from sagemaker_lightning.checkpoints import io as checkpoint_io
from sagemaker_lightning.checkpoints import last as last_checkpoint
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.toolbox.concern import CallbackOrder, Steps
from sagemaker_lightning.toolbox.lightning_package import made

pytestmark = pytest.mark.unit


def quiet_trainer(callbacks: list, **settings) -> pytorch_lightning.Trainer:
    """A CPU trainer of these callbacks that logs, prints and sanity-checks nothing."""
    return pytorch_lightning.Trainer(
        callbacks=callbacks,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **settings,
    )


def test_atomic_save_replaces_the_file_whole(tmp_path):
    io, path = made(checkpoint_io.BackgroundCheckpointIO, pytorch_lightning)(), tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1}, path)
    io.save_checkpoint({"global_step": 2}, path)
    io.wait()  # written in the background (writer.py)
    assert torch.load(path, weights_only=True) == {"global_step": 2}
    assert torch.load(tmp_path / "last-previous.ckpt", weights_only=True) == {"global_step": 1}
    assert sorted(os.listdir(tmp_path)) == ["last-previous.ckpt", "last.ckpt"]


def test_a_small_file_is_written_whole_here_and_in_an_object_store(tmp_path):
    path = tmp_path / "new" / "compile_cache.bin"  # its folder made too
    atomic.write(str(path), b"one")
    with pytest.raises(TypeError):
        atomic.write(str(path), "not bytes")  # fails while writing: nothing of it stays, not even its partial file
    assert path.read_bytes() == b"one" and os.listdir(path.parent) == ["compile_cache.bin"]
    atomic.write("memory://bucket/dir/mlflow-run.json", b"{}")  # an fsspec URL: one put
    assert fsspec.filesystem("memory").cat("/bucket/dir/mlflow-run.json") == b"{}"


def test_a_save_that_fails_midway_leaves_the_last_good_file(tmp_path):
    io, path = made(checkpoint_io.BackgroundCheckpointIO, pytorch_lightning)(), tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1}, path)
    with pytest.raises((AttributeError, pickle.PicklingError)):  # a local lambda cannot be pickled
        io.save_checkpoint({"global_step": 2, "unpicklable": lambda: None}, path)  # fails before anything is written
    io.wait()
    assert torch.load(path, weights_only=True) == {"global_step": 1} and os.listdir(tmp_path) == ["last.ckpt"]


@pytest.mark.parametrize("seconds, steps", [(0.5, 120), (2.0, 30), (61.0, 1), (1e-6, 60_000_000)])
def test_the_interval_is_about_a_minute_of_steps(seconds, steps):
    assert interval.interval_steps(seconds) == steps


def test_the_interval_is_measured_and_agreed_without_a_trainer():
    """The first step starts the clock; MEASURED_STEPS steps later the interval is the agreed one (rank 0's 30, not
    this rank's 120), and only then is there a bound to name. A set interval is named as set, and not at all where
    SIGTERM arrives."""
    rule = interval.Interval(None, "PID 1 is bash")
    assert rule.line() is None and not rule.due(30)
    assert [rule.measure(step, step * 0.5, lambda n: 30) for step in (1, 2, 3, 4)] == [False, False, False, True]
    assert rule.steps == 30 and rule.due(60) and not rule.due(45)
    assert "(PID 1 is bash)" in rule.line(measured=True)
    assert "; last.ckpt every 30 steps (about 60 s of training) bounds it" in rule.line(measured=True)
    assert "; last.ckpt at each epoch's end bounds it" in interval.Interval(0, "PID 1 is bash").line()
    assert interval.Interval(None, None).steps == 0 and interval.Interval(5, None).line() is None
    with pytest.raises(UserError, match="last_checkpoint_every_n_steps=-1 is not a number of steps"):
        interval.Interval(-1, None)


def test_where_no_sigterm_arrives_last_ckpt_comes_by_measured_steps(tmp_path, capsys):
    """every_n_steps=None without SIGTERM: after the measured steps, an interval of about a minute of training
    (here, tiny steps: many), the same on every rank, and rank 0 names the bound."""
    model_checkpoint = pytorch_lightning.callbacks.ModelCheckpoint(dirpath=str(tmp_path))
    last = made(last_checkpoint.LastCheckpoint, pytorch_lightning)(None, model_checkpoint, unprotected="PID 1 is bash")
    trainer = quiet_trainer([model_checkpoint, last, made(Steps, pytorch_lightning)([last])], max_steps=6)
    trainer.fit(BoringModel())
    assert last.interval.steps > 6  # a minute of these steps is many more than 6
    out = capsys.readouterr().out
    assert "no SIGTERM reaches the training processes (PID 1 is bash)" in out
    assert f"last.ckpt every {last.interval.steps} steps (about 60 s of training) bounds it" in out


def test_a_first_save_slower_than_the_stop_s_grace_is_said_once(tmp_path, capsys):
    """The first save of last.ckpt is timed against the stop's grace (restarts.grace_line): here every save takes
    longer than a grace of 5.5 s less the stop's 5 s (the save's clock moved by 1 s); said once, not at every save."""
    clock = iter(range(0, 1000))
    model_checkpoint = pytorch_lightning.callbacks.ModelCheckpoint(dirpath=str(tmp_path))
    last = made(last_checkpoint.LastCheckpoint, pytorch_lightning)(2, model_checkpoint, grace_s=5.5)
    last.clock = lambda: float(next(clock))
    trainer = pytorch_lightning.Trainer(max_steps=6, callbacks=[model_checkpoint, last, made(Steps, pytorch_lightning)([last])], logger=False,
                                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(BoringModel())
    out = capsys.readouterr().out
    assert out.count("saved last.ckpt") >= 3
    assert out.count("warning: saving last.ckpt took 1.0 s; with a stop's 5 s more it does not fit the 5.5 s") == 1


class Improving(pytorch_lightning.LightningModule):
    """A model whose validation accuracy rises at every validation: each one replaces the best checkpoint."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        return (self.w * batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        self.log("val/acc", float(self.global_step))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_last_checkpoint_saved_before_a_validation_names_the_best_after_it(tmp_path):
    """last.ckpt at step 4, then the validation at step 4 replaces the best of step 2 (deleted): a run resumed from
    last.ckpt must not name the deleted file, or its export fails at the end (seen on a GPU, issue 13)."""
    data = DataLoader(TensorDataset(torch.ones(8, 1)), batch_size=1)
    best = pytorch_lightning.callbacks.ModelCheckpoint(dirpath=tmp_path, monitor="val/acc", mode="max", save_top_k=1)
    last = made(last_checkpoint.LastCheckpoint, pytorch_lightning)(2, best)
    # LastCheckpoint before the ModelCheckpoint, as in the CLI's list, put after it at setup (toolbox/concern.py)
    steps = made(Steps, pytorch_lightning)([last])
    order = made(CallbackOrder, pytorch_lightning)([last, steps])
    trainer = quiet_trainer([order, last, steps, best], max_steps=4, val_check_interval=2, limit_val_batches=1)
    trainer.fit(Improving(), data, data)
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    (state,) = (v for k, v in saved["callbacks"].items() if k.startswith("ModelCheckpoint"))
    assert os.path.basename(state["best_model_path"]) == "epoch=0-step=4.ckpt"
    assert os.path.isfile(state["best_model_path"])


def test_a_read_that_fails_for_a_transient_reason_is_tried_again_not_skipped(tmp_path, monkeypatch, capsys):
    """S3 throttling or a dropped connection (an OSError) is tried again: last.ckpt is resumed from, not taken for a
    corrupt file and passed over for an older one; a read that keeps failing, or memory running out, fails the job in
    one line instead."""
    monkeypatch.setattr(checkpoint_io, "RETRY_S", 0.01)
    state = {"state_dict": {}, "optimizer_states": [], "loops": {}}
    torch.save({**state, "global_step": 4}, tmp_path / "last.ckpt")
    torch.save({**state, "global_step": 2}, tmp_path / "epoch=0-step=2.ckpt")
    load, failures = torch.load, []

    def flaky(*args, **kwargs):
        if failures:
            raise failures.pop()
        return load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", flaky)
    failures[:] = [TimeoutError("Read timed out")]
    assert resume.resume_path(str(tmp_path)) == f"{tmp_path}/last.ckpt"
    assert (
        f"reading {tmp_path}/last.ckpt failed (TimeoutError: Read timed out); trying again" in capsys.readouterr().out
    )
    failures[:] = [OSError("SlowDown")] * checkpoint_io.TRIES
    with pytest.raises(UserError, match=r"cannot read .*/last.ckpt \(OSError: SlowDown\), tried 3 times"):
        resume.resume_path(str(tmp_path))
    failures[:] = [MemoryError()]
    with pytest.raises(MemoryError):
        resume.resume_path(str(tmp_path))


class Learning(BoringModel):
    """A validation loss that falls each epoch: each epoch's checkpoint replaces the one before as the best."""

    def validation_step(self, batch, batch_idx):
        self.log("loss", -float(self.current_epoch))


def test_last_ckpt_at_an_epochs_end_holds_that_epochs_top_k_update(tmp_path):
    """Validation once an epoch: ModelCheckpoint updates its top k in on_train_epoch_end, which Lightning calls after
    every other callback's; last.ckpt, saved there too, must hold the update (a run resumed from it forgot its best:
    it exported the final weights, and kept the file the best should have replaced)."""
    model_checkpoint = pytorch_lightning.callbacks.ModelCheckpoint(dirpath=str(tmp_path), monitor="loss", save_top_k=1)
    last = made(last_checkpoint.LastCheckpoint, pytorch_lightning)(0, model_checkpoint)
    trainer = quiet_trainer(
        [model_checkpoint, last, made(Steps, pytorch_lightning)([last])],
        max_epochs=2,
        limit_train_batches=2,
        limit_val_batches=1,
    )
    trainer.fit(Learning())
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)["callbacks"][model_checkpoint.state_key]
    assert (
        os.path.basename(saved["best_model_path"])
        == "epoch=1-step=4.ckpt"
        == os.path.basename(model_checkpoint.best_model_path)
    )
    assert list(saved["best_k_models"]) == list(model_checkpoint.best_k_models)
