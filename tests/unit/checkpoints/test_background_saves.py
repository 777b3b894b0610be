"""Saves in the background (checkpoints/writer.py): the training thread returns after the snapshot, at most one save
is in flight, the same state is written once, a removal waits its turn, and a write that fails is one line in the
training thread with the save before it kept, a stop's final save included (a job in this process). The writes here
are held back by an event, not timed.

    .venv/bin/pytest tests/unit/checkpoints/test_background_saves.py
"""

import errno
import functools
import os
import signal
import threading
import time

import pytest
import pytorch_lightning
import torch

from sagemaker_lightning.checkpoints import writer as background
from sagemaker_lightning.checkpoints.io import BackgroundCheckpointIO
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.toolbox.concern import Steps
from sagemaker_lightning.toolbox.lightning_package import made

pytestmark = pytest.mark.unit


@pytest.fixture
def held(monkeypatch):
    """torch.save in the writer thread waits for `release`; `written` counts the files it wrote."""
    release, written, save = threading.Event(), [], torch.save

    def held_save(obj, f, *args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            assert release.wait(30), "the test never released the write"
            written.append(f)
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(background.torch, "save", held_save)
    return release, written


def state(step: int, weight: torch.Tensor) -> dict:
    return {"global_step": step, "loops": {"batches": step}, "state_dict": {"w": weight}, "callbacks": {}}


def test_a_save_returns_before_its_write_and_the_file_holds_the_state_as_it_was(tmp_path, held):
    release, _ = held
    io, path, weight = made(BackgroundCheckpointIO, pytorch_lightning)(), tmp_path / "last.ckpt", torch.zeros(4)
    io.save_checkpoint(state(1, weight), path)
    assert not path.exists()  # returned; the write waits for the release
    weight += 1  # training goes on in place
    release.set()
    io.wait()
    assert torch.equal(torch.load(path, weights_only=True)["state_dict"]["w"], torch.zeros(4))


def test_at_most_one_save_is_in_flight_and_a_second_waits_for_the_first(tmp_path, held):
    release, written = held
    io, weight = made(BackgroundCheckpointIO, pytorch_lightning)(), torch.zeros(4)
    io.save_checkpoint(state(1, weight), tmp_path / "a.ckpt")
    weight += 1
    second = threading.Thread(target=io.save_checkpoint, args=(state(2, weight), tmp_path / "b.ckpt"))
    second.start()
    second.join(0.5)
    assert second.is_alive() and written == []  # waits for the first write: its buffers are the snapshot
    release.set()
    second.join(30)
    io.wait()
    assert [os.path.basename(f) for f in written] == [".a.ckpt.partial", ".b.ckpt.partial"]
    assert torch.equal(torch.load(tmp_path / "b.ckpt", weights_only=True)["state_dict"]["w"], torch.ones(4))


def test_saves_asked_faster_than_they_are_written_wait_and_say_so_once_with_the_setting(tmp_path, monkeypatch, capsys):
    """Each write is held until the training thread waits for it: every save after the first finds the one before
    still being written."""
    gate, save, check = threading.Semaphore(0), torch.save, background.Writer._check

    def gated_save(obj, f, *args, **kwargs):
        assert gate.acquire(timeout=30), "no save waited for this write"
        return save(obj, f, *args, **kwargs)

    def waited(writer, future):
        if future is not None:
            gate.release()
        check(writer, future)

    monkeypatch.setattr(background.torch, "save", gated_save)
    monkeypatch.setattr(background.Writer, "_check", waited)
    io, path = made(BackgroundCheckpointIO, pytorch_lightning)(), tmp_path / "last.ckpt"
    for step in (25, 50, 75):
        io.save_checkpoint(state(step, torch.full((4,), step)), path)
    io.wait()
    said = [line for line in capsys.readouterr().out.splitlines() if "faster than they are written" in line]
    assert len(said) == 1 and f"writing {path} took " in said[0] and "(25 steps) apart" in said[0], said
    assert int(said[0].rsplit("last_checkpoint_every_n_steps=", 1)[1].split()[0]) > 25  # the write outlasts 25 steps
    assert torch.load(path, weights_only=True)["global_step"] == 75


def test_the_same_state_is_written_once_and_named_again_by_a_link(tmp_path, held):
    release, written = held
    release.set()
    io, weight = made(BackgroundCheckpointIO, pytorch_lightning)(), torch.zeros(4)
    best, last = tmp_path / "epoch=0-step=3.ckpt", tmp_path / "last.ckpt"
    io.save_checkpoint(state(3, weight), best)
    io.save_checkpoint({**state(3, weight), "callbacks": {"Goodput": {"records": [1.5]}}}, last)  # its clock moved
    io.wait()
    assert len(written) == 1 and os.stat(best).st_ino == os.stat(last).st_ino
    weight += 1  # another state at the same step: written
    io.save_checkpoint(state(3, weight), last)
    io.save_checkpoint({**state(3, weight), "loops": {"batches": 4}}, best)  # another moment: written
    io.wait()
    assert len(written) == 3 and os.stat(best).st_ino != os.stat(last).st_ino
    previous = torch.load(tmp_path / "last-previous.ckpt", weights_only=True)  # the linked state, kept
    assert torch.equal(previous["state_dict"]["w"], torch.zeros(4))


def test_a_removal_waits_for_the_writes_asked_before_it(tmp_path, held):
    release, _ = held
    io, older = made(BackgroundCheckpointIO, pytorch_lightning)(), tmp_path / "epoch=0-step=3.ckpt"
    older.write_bytes(b"the best until now")
    io.save_checkpoint(state(6, torch.zeros(4)), tmp_path / "epoch=1-step=6.ckpt")
    io.remove_checkpoint(older)
    assert older.exists()  # the new best is not complete yet
    release.set()
    io.wait()
    assert sorted(os.listdir(tmp_path)) == ["epoch=1-step=6.ckpt"]


def test_a_write_that_fails_is_one_line_in_the_training_thread_and_the_save_before_it_stays(tmp_path, held):
    release, _ = held
    release.set()
    io, path = made(BackgroundCheckpointIO, pytorch_lightning)(), tmp_path / "ckpts" / "last.ckpt"
    io.save_checkpoint(state(1, torch.zeros(4)), path)
    io.wait()
    os.rename(tmp_path / "ckpts", tmp_path / "kept")
    (tmp_path / "ckpts").write_bytes(b"a file where the folder was")  # the next write cannot make its folder
    io.save_checkpoint(state(2, torch.ones(4)), path)
    io.remove_checkpoint(tmp_path / "kept" / "last.ckpt")  # as ModelCheckpoint drops the best the failed one beat
    with pytest.raises(UserError, match=r"^writing .*ckpts/last\.ckpt failed in the background \(\w+Error: .*"):
        io.wait()
    io.wait()  # said once
    assert torch.load(tmp_path / "kept" / "last.ckpt", weights_only=True)["global_step"] == 1  # not removed
    io.save_checkpoint(state(3, torch.ones(4)), tmp_path / "kept" / "again.ckpt")  # the writer goes on afterwards
    io.wait()
    assert (tmp_path / "kept" / "again.ckpt").exists()


def test_the_partial_files_of_writes_a_kill_cut_short_are_removed_at_the_start(tmp_path):
    """A best checkpoint's background write killed midway leaves its partial file under a name no later save reuses
    (seen in the two-host SIGKILL chain): the next fit removes it, and nothing else."""
    from pytorch_lightning.demos.boring_classes import BoringModel

    from sagemaker_lightning.checkpoints.last import LastCheckpoint

    (tmp_path / ".epoch=0-step=3.ckpt.partial").write_bytes(b"PK cut short")
    (tmp_path / "notes.txt").write_text("the user's")
    best = pytorch_lightning.callbacks.ModelCheckpoint(dirpath=tmp_path, save_top_k=0)
    last = made(LastCheckpoint, pytorch_lightning)(0, best)
    trainer = pytorch_lightning.Trainer(
        callbacks=[best, last, made(Steps, pytorch_lightning)([last])],
        max_steps=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(BoringModel())
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt", "notes.txt"]


def test_modelcheckpoints_version_counter_names_no_file_still_being_written(tmp_path, monkeypatch):
    """filename="model", save_top_k=3, a save every step, a disk slower than a step: Lightning keeps model.ckpt,
    model-v1.ckpt and model-v2.ckpt; asked whether model.ckpt exists before its write landed, ModelCheckpoint wrote
    the next best over it."""
    from pytorch_lightning.demos.boring_classes import BoringModel

    from sagemaker_lightning.checkpoints.last import LastCheckpoint

    save = torch.save

    def slow(*args, **kwargs):  # in the writer thread: slower than a step
        if threading.current_thread() is not threading.main_thread():
            time.sleep(0.3)
        return save(*args, **kwargs)

    monkeypatch.setattr(background.torch, "save", slow)

    class Improving(BoringModel):  # a better loss each step: each save is a new best
        def training_step(self, batch, batch_idx):
            self.log("score", float(-self.global_step))
            return super().training_step(batch, batch_idx)

    best = pytorch_lightning.callbacks.ModelCheckpoint(
        dirpath=tmp_path, filename="model", save_top_k=3, monitor="score", every_n_train_steps=1
    )
    io = made(BackgroundCheckpointIO, pytorch_lightning)()
    last = made(LastCheckpoint, pytorch_lightning)(0, best, io=io)
    trainer = pytorch_lightning.Trainer(
        callbacks=[best, last, made(Steps, pytorch_lightning)([last])], plugins=[io], max_steps=3, limit_val_batches=0, logger=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Improving())
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt", "model-v1.ckpt", "model-v2.ckpt", "model.ckpt"]
    steps = [torch.load(tmp_path / f"model{v}.ckpt", weights_only=True)["global_step"] for v in ("", "-v1", "-v2")]
    assert steps == [1, 2, 3]


def test_tied_weights_are_saved_once_and_load_tied(tmp_path, held):
    """A language model's embedding tied to its output layer: the state dict names one tensor twice; the file holds it
    once, as torch.save of the live state does, not twice."""
    release, _ = held
    release.set()
    embedding = torch.nn.Embedding(1000, 64)
    head = torch.nn.Linear(64, 1000, bias=False)
    head.weight = embedding.weight
    weights = {**{f"embedding.{k}": v for k, v in embedding.state_dict().items()}, "head.weight": head.weight}
    io = made(BackgroundCheckpointIO, pytorch_lightning)()
    io.save_checkpoint({**state(1, torch.zeros(1)), "state_dict": weights}, tmp_path / "tied.ckpt")
    io.wait()
    torch.save({**state(1, torch.zeros(1)), "state_dict": weights}, tmp_path / "reference.ckpt")
    assert os.path.getsize(tmp_path / "tied.ckpt") <= os.path.getsize(tmp_path / "reference.ckpt") + 1024
    loaded = torch.load(tmp_path / "tied.ckpt", weights_only=True)["state_dict"]
    assert loaded["head.weight"].data_ptr() == loaded["embedding.weight"].data_ptr()


def test_weights_untied_after_a_save_each_get_their_own_buffer_again():
    snapshot, tied = background.Snapshot(), torch.zeros(3)
    snapshot.take({"a": tied, "b": tied})
    taken = snapshot.take({"a": torch.ones(3), "b": torch.full((3,), 2.0)})  # one buffer written twice would be 2s
    assert torch.equal(taken["a"], torch.ones(3)) and torch.equal(taken["b"], torch.full((3,), 2.0))


def test_last_ckpt_is_said_saved_once_its_file_is_there(tmp_path, held, capsys):
    """A log's "saved last.ckpt at epoch E step S" means the file is complete: a kill after the line finds it."""
    release, _ = held
    io = made(BackgroundCheckpointIO, pytorch_lightning)()
    io.save_checkpoint({**state(4, torch.zeros(4)), "epoch": 0}, tmp_path / "last.ckpt")
    assert "saved last.ckpt" not in capsys.readouterr().out  # handed to the writer, not written yet
    release.set()
    io.wait()
    assert capsys.readouterr().out == "saved last.ckpt at epoch 0 step 4\n"


def test_a_stops_final_save_that_fails_ends_the_job_in_one_line_naming_it_and_the_save_before_it_stays(
    as_script, tmp_path, monkeypatch, capsys, request
):
    """SIGTERM after step 3, last.ckpt saved at step 2; the stop's save at step 3 finds the disk full halfway through
    its file. The job ends in one line naming that write (not "stopped ... after saving last.ckpt"), on stderr and in
    the failure file, and a restart still resumes from step 2, no half file left."""
    from pytorch_lightning.demos.boring_classes import BoringModel

    from sagemaker_lightning import LightningCLI
    from sagemaker_lightning.boot import signals
    from sagemaker_lightning.checkpoints import resume

    job = {"SM_HOSTS": '["localhost"]', "SM_CURRENT_HOST": "localhost", "SM_NUM_GPUS": "0"}
    monkeypatch.setattr(os, "environ", {**os.environ, **job, "SM_OUTPUT_DIR": str(tmp_path)})
    monkeypatch.setattr(signals, "RUN_DIR", str(tmp_path / "run"))
    # the error raised in on_exception skips Lightning's teardown, which would put this process's handler back: a
    # SIGTERM to pytest (or to a child it forks) would only set a dead trainer's flag
    request.addfinalizer(functools.partial(signal.signal, signal.SIGTERM, signal.getsignal(signal.SIGTERM)))
    save = torch.save

    def full_at_the_stop(obj, f, *args, **kwargs):
        if threading.current_thread() is not threading.main_thread() and obj["global_step"] == 3:
            with open(f, "wb") as half:
                half.write(b"PK half a checkpoint")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(background.torch, "save", full_at_the_stop)

    class Stopped(BoringModel):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            if self.global_step == 3:
                self.trainer._signal_connector._sigterm_notifier_fn(signal.SIGTERM, None)  # its SIGTERM handler

    ckpts = tmp_path / "ckpts"
    args = ["fit", "--trainer.max_steps=8", "--trainer.accelerator=cpu", "--trainer.limit_val_batches=0"]
    args += ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    args += [f"--checkpoint.dirpath={ckpts}", f"--trainer.default_root_dir={tmp_path}"]
    with pytest.raises(SystemExit) as exit:
        as_script(LightningCLI, Stopped, args=[*args, "--last_checkpoint_every_n_steps=2"], save_config_callback=None)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ERROR: ")]
    assert exit.value.code == 1 and len(errors) == 1, errors
    said = f"writing {ckpts / 'last.ckpt'} failed in the background (OSError: [Errno {errno.ENOSPC}] "
    assert errors[0].startswith(f"ERROR: {said}") and "the save before it is kept" in errors[0], errors
    assert (tmp_path / "failure").read_text() == errors[0].removeprefix("ERROR: ") + "\n"
    kept = resume.resume_path(str(ckpts), announce=False)  # what the restarted job resumes from
    assert kept and resume.resumable_step(kept, None) == 2 and os.listdir(ckpts).count(".last.ckpt.partial") == 0
