"""What a resume does besides continuing exactly, which the interruption oracle sweeps (test_resume_oracle.py): a
stop in the sanity check saves nothing; a last.ckpt that does not load falls back to the newest checkpoint that does,
or to last-previous.ckpt; a checkpoint that cannot be resumed from fails in one line; checkpoints in S3 and in the
job's checkpoint_local_path; fsdp resumes from the save before one that S3 brought back incomplete.

In-process runs of the runtime's LightningCLI in a SageMaker environment (one host, /opt/ml in a temporary folder),
as a job runs them. SIGKILL is an exception raised at the point: nothing after it writes to the checkpoint directory
(the runtime saves only on SIGTERM), so the directory is left as a SIGKILL leaves it. SIGTERM is the real signal,
handled as in a job.

    .venv/bin/pytest tests/toolkit/test_resume.py
"""

import json
import multiprocessing
import os
import shutil
import signal

import lightning.pytorch
import pytest
import pytorch_lightning
import torch
from torch.distributed.tensor import DTensor
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import device_data  # noqa: F401  (--data finds DeviceCIFAR10DataModule by its short name)
from data import CIFAR10Base
from sagemaker_lightning import LightningCLI
from sagemaker_lightning.boot import signals

pytestmark = pytest.mark.toolkit


def tiny_model(pl):
    """A classifier of flattened inputs with dropout (random numbers every step) and momentum (optimizer state)."""

    class Tiny(pl.LightningModule):
        def __init__(self, features: int = 3 * 32 * 32, num_classes: int = 10):
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Flatten(), torch.nn.Dropout(0.5), torch.nn.Linear(features, num_classes)
            )

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val/acc", (self.net(x).argmax(1) == y).float().mean())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    return Tiny


class PlainPoints(lightning.pytorch.LightningDataModule):
    """A user's data module as Lightning's docs write one: plain DataLoaders, shuffled, the last batch short."""

    def setup(self, stage: str) -> None:
        generator = torch.Generator().manual_seed(0)
        points, labels = torch.randn(128, 8, generator=generator), torch.randint(0, 3, (128,), generator=generator)
        self.train, self.val = TensorDataset(points[:80], labels[:80]), TensorDataset(points[80:], labels[80:])

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=32, shuffle=True)  # 32, 32, 16

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=32)  # 2 batches


# pipeline: (model class, data class, its arguments)
IMAGES = tiny_model(pytorch_lightning)  # the example is built on pytorch_lightning
EXAMPLE = ["--data.val_split=48", "--data.batch_size=32"]  # 112 training images: 3 steps; validation: 2 batches
PIPELINES = {
    "device-resident": (IMAGES, CIFAR10Base, ["--data=DeviceCIFAR10DataModule", *EXAMPLE]),
    "a user's plain DataLoader": (tiny_model(lightning.pytorch), PlainPoints, ["--model.features=8"]),
}
SETTINGS = [
    "--trainer.max_epochs=3",
    "--trainer.accelerator=cpu",
    "--trainer.logger=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--last_checkpoint_every_n_steps=2",
]


class Killed(Exception):
    """Stands for SIGKILL (module docstring)."""


def kill_at(step: int) -> dict:
    """A callback's hooks (for a class of the model's Lightning package) that stand for a SIGKILL at the start of
    global step `step`."""

    def act(self, trainer, *args, **kwargs):
        if not self.done and trainer.global_step == step and not trainer.sanity_checking:
            self.done = True
            raise Killed(f"at step {step}")

    return {"on_train_batch_start": act, "done": False}


@pytest.fixture
def job(tmp_path, archive_dir, monkeypatch, as_script):
    """Runs the runtime's LightningCLI as a one-host SageMaker job whose /opt/ml is `base` (default: tmp_path);
    returns the final step and weights of a run that ends, or its exit code."""
    monkeypatch.setattr(signals, "RUN_DIR", str(tmp_path / "run"))

    def run(pipeline: str, callback=None, base=tmp_path, more: tuple[str, ...] = ()):
        model, data, arguments = PIPELINES[pipeline]
        environ = dict(os.environ)  # the plan sets variables
        for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE"):  # a job's process starts without (an in-process
            os.environ.pop(key, None)  # DDP run of another test leaves them behind)
        os.environ.update(
            {
                "SM_HOSTS": '["localhost"]',
                "SM_CURRENT_HOST": "localhost",
                "SM_NUM_GPUS": "0",
                "SAGEMAKER_BASE_DIR": str(base),  # checkpoints: base/checkpoints
                "SM_CHANNELS": '["training"]',
                "SM_CHANNEL_TRAINING": archive_dir,
                "SM_INPUT_CONFIG_DIR": str(base / "config"),  # no hyperparameters.json: the arguments as given
                "SM_OUTPUT_DIR": str(base / "output"),
                "SM_OUTPUT_DATA_DIR": str(base / "output" / "data"),
                "SM_MODEL_DIR": str(base / "model"),  # SageMaker always sets it: the export runs, as in a job
            }
        )
        (base / "output").mkdir(parents=True, exist_ok=True)
        pl = pytorch_lightning if data is CIFAR10Base else lightning.pytorch
        try:
            cli = as_script(  # a failure ends the process as in a job: one line, exit code 1
                LightningCLI,
                model,
                data,
                subclass_mode_data=data is CIFAR10Base,
                seed_everything_default=42,
                save_config_callback=None,
                trainer_defaults={"callbacks": [type("Stop", (pl.Callback,), callback)()]} if callback else None,
                args=[*SETTINGS, *arguments, *more],
            )
        except SystemExit as e:
            return e.code
        finally:
            os.environ.clear()
            os.environ.update(environ)
            # A stopped job's process ends, its DataLoader workers with it; in-process, the stopped epoch's workers would
            # wait for the iterator's garbage collection, then ignore its SIGTERM (Lightning's handler, inherited):
            # 90 s of a whole run went to that
            for worker in multiprocessing.active_children():
                worker.kill()
                worker.join()
        return cli.trainer.global_step, {k: v.clone() for k, v in cli.model.state_dict().items()}

    return run


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one intra-op thread is more than twice as fast as two on a shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def uninterrupted():
    return {}  # pipeline → (global step, weights), filled by the first test of each pipeline


def reference(job, uninterrupted, pipeline: str, tmp_path) -> tuple[int, dict]:
    if pipeline not in uninterrupted:
        uninterrupted[pipeline] = job(pipeline, base=tmp_path / "uninterrupted")
    return uninterrupted[pipeline]


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


KILL_AT_5 = kill_at(5)  # last.ckpt at step 4, the epoch's checkpoint at step 3


def test_a_stop_during_the_sanity_check_saves_nothing_and_the_rerun_starts_afresh(job, uninterrupted, tmp_path):
    """SIGTERM while Lightning's sanity check validates, before any step: the job stops (143) without a last.ckpt of
    a run that trained nothing, and the rerun is the uninterrupted run."""
    expected = reference(job, uninterrupted, "device-resident", tmp_path)

    def sigterm(self, trainer, *args):
        if trainer.sanity_checking and not self.done:
            self.done = True
            os.kill(os.getpid(), signal.SIGTERM)

    assert job("device-resident", {"on_validation_batch_start": sigterm, "done": False}) == 143
    assert not os.path.exists(tmp_path / "checkpoints" / "last.ckpt")
    step, weights = job("device-resident")
    assert step == expected[0] and same(weights, expected[1])


def test_an_unreadable_last_checkpoint_falls_back_to_the_newest_readable_one(job, uninterrupted, tmp_path, capsys):
    """last.ckpt cut short (a full disk, a partial upload): the job resumes from the newest checkpoint that loads,
    saying so in one line, and still ends as the uninterrupted run."""
    expected = reference(job, uninterrupted, "device-resident", tmp_path)
    assert job("device-resident", dict(KILL_AT_5)) == 1
    last = tmp_path / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:4096])
    capsys.readouterr()
    step, weights = job("device-resident")
    out = capsys.readouterr().out
    assert (
        f"resuming from {tmp_path}/checkpoints/epoch=0-step=3.ckpt (step 3), the newest checkpoint that can be: "
        "not from last.ckpt, it does not load (RuntimeError: PytorchStreamReader failed reading zip archive" in out
    )
    assert "resuming at epoch 0 step 3 from epoch=0-step=3.ckpt" in out
    assert step == expected[0] and same(weights, expected[1])


def test_last_ckpt_is_never_the_only_copy_of_the_progress(job, uninterrupted, tmp_path, capsys):
    """Before last.ckpt is replaced its file stays as last-previous.ckpt, so that a last.ckpt that S3 brings back
    unreadable (an upload cut short by a reclaim) is not the only copy, even with no other checkpoint kept
    (checkpoint.save_top_k=0): the job resumes from the predecessor and still ends as the uninterrupted run."""
    expected = reference(job, uninterrupted, "device-resident", tmp_path)
    none_kept = ["--checkpoint.save_top_k=0"]
    assert job("device-resident", dict(KILL_AT_5), more=none_kept) == 1
    kept = sorted(os.listdir(tmp_path / "checkpoints"))
    assert kept == ["goodput.json", "last-previous.ckpt", "last.ckpt"]  # goodput.py's ledger beside them
    last = tmp_path / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:4096])
    capsys.readouterr()
    step, weights = job("device-resident", more=none_kept)
    out = capsys.readouterr().out
    assert f"resuming from {tmp_path}/checkpoints/last-previous.ckpt (step 3), the newest checkpoint that can be" in out
    assert step == expected[0] and same(weights, expected[1])


@pytest.mark.parametrize(
    "written, expected",
    [
        ("another model", "it was written by another model: net.2.weight is (12, 3072) there, (10, 3072) in the model"),
        ("garbage", "it does not load (UnpicklingError: "),
    ],
)
def test_a_checkpoint_that_cannot_be_resumed_from_fails_in_one_line(job, tmp_path, capsys, written, expected):
    """Nothing to fall back to: one line naming the file, why, and what to do."""
    if written == "another model":  # an older version of the model, with 12 classes
        assert job("device-resident", dict(KILL_AT_5), more=["--model.num_classes=12"]) == 1
        (tmp_path / "output" / "failure").unlink()
        for name in os.listdir(tmp_path / "checkpoints"):
            if name != "last.ckpt":
                os.remove(tmp_path / "checkpoints" / name)
    else:
        (tmp_path / "checkpoints").mkdir()
        (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"<html>an error page saved as the checkpoint</html>")
    capsys.readouterr()
    assert job("device-resident") == 1
    line = f"cannot resume from {tmp_path}/checkpoints/last.ckpt: {expected}"
    errors = [e for e in capsys.readouterr().err.splitlines() if e.startswith("ERROR: ")]
    assert len(errors) == 1 and errors[0].startswith(f"ERROR: {line}")
    assert "delete it (and its copy under the job's checkpoint_s3_uri)" in errors[0]
    failure = (tmp_path / "output" / "failure").read_text()
    assert failure.count("\n") == 1 and failure.startswith(line)


def test_resumes_from_s3(job, uninterrupted, tmp_path, aws, capsys):
    """checkpoint.dirpath=s3://...: last.ckpt written there (moto) and resumed from; the export reads the best
    checkpoint from there into model.pt."""
    import boto3

    boto3.client("s3").create_bucket(Bucket="checkpoints")
    expected = reference(job, uninterrupted, "device-resident", tmp_path)
    s3 = ["--checkpoint.dirpath=s3://checkpoints/job-1"]
    assert job("device-resident", dict(KILL_AT_5), more=s3) == 1
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket="checkpoints")["Contents"]]
    assert "job-1/last.ckpt" in keys
    capsys.readouterr()
    step, weights = job("device-resident", more=s3)
    out = capsys.readouterr().out
    assert "resuming at epoch 1 step 4 from last.ckpt" in out
    assert step == expected[0] and same(weights, expected[1])
    assert f"model: {tmp_path}/model/model.pt from s3://checkpoints/job-1/epoch=2-step=9.ckpt" in out
    assert same(torch.load(tmp_path / "model" / "model.pt", weights_only=True), weights)  # the best is the last here


def test_resumes_from_the_jobs_checkpoint_local_path(job, uninterrupted, tmp_path, capsys):
    """A job whose CheckpointConfig moves the checkpoints (checkpoint_local_path): SageMaker names the directory in
    checkpointconfig.json; last.ckpt is written there and resumed from."""
    expected = reference(job, uninterrupted, "device-resident", tmp_path)
    (tmp_path / "config").mkdir()
    local = tmp_path / "elsewhere"
    (tmp_path / "config" / "checkpointconfig.json").write_text(
        json.dumps({"LocalPath": str(local), "S3Uri": "s3://bucket/job-1/checkpoints"})
    )
    assert job("device-resident", dict(KILL_AT_5)) == 1
    assert os.path.isfile(local / "last.ckpt") and not os.path.exists(tmp_path / "checkpoints")
    capsys.readouterr()
    step, weights = job("device-resident")
    assert "resuming at epoch 1 step 4 from last.ckpt" in capsys.readouterr().out
    assert step == expected[0] and same(weights, expected[1])


def test_fsdp_resumes_from_the_save_before_one_that_s3_brought_back_incomplete(job, tmp_path, capsys):
    """trainer.strategy=fsdp keeps the newest complete save and the one before it: SageMaker uploads the checkpoint
    directory in the background, so a reclaim can leave S3 with the newest save incomplete. The directory as S3
    restores it then (the newest save with a shard missing, then with a shard cut short): the job resumes from the
    save before it and ends with the uninterrupted run's weights."""
    fsdp = ("--trainer.strategy=fsdp", "--trainer.devices=1")
    done = tmp_path / "uninterrupted"
    step, expected = job("a user's plain DataLoader", base=done, more=fsdp)
    saves = sorted(os.listdir(done / "checkpoints" / "last.ckpt"))
    assert step == 9 and [s[:14] for s in saves] == ["step-000000008", "step-000000009"]  # saved at 8, and at 9
    for how in ("missing", "cut short"):
        base = tmp_path / how.replace(" ", "-")
        shutil.copytree(done / "checkpoints", base / "checkpoints")
        shard = base / "checkpoints" / "last.ckpt" / saves[-1] / "__0_0.distcp"
        shard.unlink() if how == "missing" else os.truncate(shard, shard.stat().st_size // 2)
        capsys.readouterr()
        step, weights = job("a user's plain DataLoader", base=base, more=fsdp)
        out = capsys.readouterr().out
        assert f"not resuming from {saves[-1]} lacks __0_0.distcp" in out
        assert "resuming at epoch 2 step 8 from last.ckpt" in out
        assert step == 9 and same(local(weights), local(expected))


def local(state: dict) -> dict:
    """Sharded (DTensor) weights of a one-process fsdp run as plain tensors."""
    return {k: v.to_local() if isinstance(v, DTensor) else v for k, v in state.items()}
