"""Two claims of docs/reliability.md that need two ranks, held by two real gloo processes (spawned once for both:
each costs torch's and Lightning's import), and a refusal at the start:
  - one resume point for all ranks (resume.ResumePoint): global rank 0 chooses the checkpoint once the ranks have
    joined, and every rank loads that one, though each host holds its own copy of the checkpoint directory (SageMaker
    downloads checkpoint_s3_uri to every host) and the copies can differ; each rank has its own view of one directory
    here (fsspec's memory filesystem is per process) and loads through the trainer's CheckpointIO, as Lightning does
    when it resumes. A rank choosing on its own fails it;
  - the export failing on rank 0 (checkpoints/export.py): every rank fails at once, naming it, not after waiting out
    dist_timeout. A rank 0 that fails before answering, or a rank 1 that is not told, fails it;
  - model_dir=s3://... is refused in one line at the start, before anything trains.

    .venv/bin/python -m pytest tests/unit/checkpoints/test_two_ranks.py -q
"""

import datetime
import errno
import io
import os
import sys
import time
from types import SimpleNamespace

import fsspec
import lightning.pytorch
import pytest
import spawned
import torch
import torch.distributed as dist
from lightning.pytorch.demos.boring_classes import BoringModel

from sagemaker_lightning import LightningCLI
from sagemaker_lightning.checkpoints import concern as checkpoints
from sagemaker_lightning.checkpoints import export
from sagemaker_lightning.checkpoints.io import BackgroundCheckpointIO
from sagemaker_lightning.toolbox.lightning_package import made

pytestmark = pytest.mark.unit

CUT_SHORT = None  # a file whose copy on that host was cut short
# checkpoint directory → each rank's view of it: file name → the step of the checkpoint there
VIEWS = {
    # last.ckpt cut short everywhere; rank 1's copy holds a newer checkpoint than rank 0's: it would resume from step 5
    "memory://fallback": [
        {"last.ckpt": CUT_SHORT, "epoch=0-step=3.ckpt": 3},
        {"last.ckpt": CUT_SHORT, "epoch=0-step=3.ckpt": 3, "epoch=0-step=5.ckpt": 5},
    ],
    # rank 1's copy of last.ckpt cut short: on its own it would fall back to step 3 and train from another step
    "memory://last": [
        {"last.ckpt": 5, "epoch=0-step=3.ckpt": 3},
        {"last.ckpt": CUT_SHORT, "epoch=0-step=3.ckpt": 3},
    ],
}
TINY = ["--trainer.max_steps=1", "--trainer.limit_val_batches=0", "--trainer.logger=false"]
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
DIST_TIMEOUT_S = 300  # far longer than the run: a rank that waited it out would show
FULL = "No space left on device"  # rank 0's export fails with it


def resuming(rank: int) -> dict:
    """Its view of each directory, then the resume as the trainer's CheckpointIO does it: for each directory, the
    checkpoint chosen and the step loaded (or why it could not be)."""
    model, fs = torch.nn.Linear(2, 2), fsspec.filesystem("memory")
    loaded = {}
    for dirpath, views in VIEWS.items():
        for name, step in views[rank].items():
            with fs.open(f"{dirpath}/{name}", "wb") as f:
                if step is CUT_SHORT:
                    f.write(b"PK\x03\x04 cut short")
                else:
                    state = {"state_dict": model.state_dict(), "optimizer_states": [], "loops": {}, "global_step": step}
                    torch.save(state, f)
        point = checkpoints.resume_point(SimpleNamespace(dirpath=dirpath), model, False, rank == 0)
        checkpoint_io = made(BackgroundCheckpointIO, lightning.pytorch)(resume_point=point)
        try:
            step = checkpoint_io.load_checkpoint(point.candidate)["global_step"]
        except Exception as e:  # a copy that does not load: this rank fails, it does not train from another step
            step = type(e).__name__
        loaded[dirpath] = (point.chosen, step)
    return loaded


def exporting(rank: int, model_dir: str) -> tuple:
    """A fit of one step on two hosts' ranks (each a node of one process, as Lightning runs processes another launcher
    started) whose rank 0 finds its disk full when it writes the model: its exit code, ERROR lines, when rank 0's
    write failed and when the rank ended."""
    os.environ.update(NODE_RANK=str(rank), LOCAL_RANK="0")
    failed_at = []

    def full(*args):
        failed_at.append(time.monotonic())
        raise OSError(errno.ENOSPC, FULL)

    if rank == 0:
        export.write = full
    sys.stderr = err = io.StringIO()
    ddp = ["--trainer.accelerator=cpu", "--trainer.strategy=ddp", "--trainer.num_nodes=2", "--trainer.devices=1"]
    args = ["fit", *TINY, *QUIET, *ddp, f"--model_dir={model_dir}", f"--dist_timeout={DIST_TIMEOUT_S}"]
    code = 0
    try:
        try:
            LightningCLI(BoringModel, args=args, save_config_callback=None)
        except Exception as e:  # as a script ends: the runtime's excepthook, its line and exit code
            sys.excepthook(type(e), e, e.__traceback__)
    except SystemExit as e:
        code = e.code
    lines = [line for line in err.getvalue().splitlines() if line.startswith("ERROR: ")]
    return code, lines, failed_at[0] if failed_at else None, time.monotonic()


def one_rank(rank: int, ports: tuple[int, int], workdir: str, out) -> None:
    """One rank: the resume over a process group of its own, then the fit, which starts Lightning's."""
    for name in [n for n in os.environ if n.startswith(("SM_", "SAGEMAKER_"))]:
        del os.environ[name]  # this process's own environment: it ends with the rank
    os.chdir(workdir)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ports[0]))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    loaded = resuming(rank)
    dist.destroy_process_group()
    os.environ["MASTER_PORT"] = str(ports[1])
    out.put((rank, (loaded, exporting(rank, os.path.join(workdir, "model")))))


@pytest.fixture(scope="module")
def ranks(free_port, tmp_path_factory) -> tuple[dict, dict, str]:
    """What each of the two ranks loaded, and how its fit ended; the fit's working directory."""
    workdir = str(tmp_path_factory.mktemp("two-ranks"))
    results = spawned.two_ranks(one_rank, (free_port(), free_port()), workdir, timeout_s=600)
    return {r: results[r][0] for r in results}, {r: results[r][1] for r in results}, workdir


def test_every_rank_loads_the_checkpoint_rank_0_chose(ranks):
    loaded = ranks[0]
    fallback, last = "memory://fallback/epoch=0-step=3.ckpt", "memory://last/last.ckpt"
    assert loaded[0] == {"memory://fallback": (fallback, 3), "memory://last": (last, 5)}
    # rank 1 resumes from rank 0's step 3, not its own newer file; its copy of rank 0's last.ckpt does not load
    assert loaded[1]["memory://fallback"] == (fallback, 3)
    assert loaded[1]["memory://last"][0] == last and loaded[1]["memory://last"][1] not in (3, 5)


def test_rank_0s_export_failing_fails_every_rank_at_once_naming_it(ranks):
    (code_0, lines_0, failed_at, _), (code_1, lines_1, _, ended_1) = ranks[1][0], ranks[1][1]
    assert code_0 == 1 and len(lines_0) == 1 and FULL in lines_0[0], lines_0
    assert "could not write the model to model_dir=" in lines_0[0]  # what failed, not only the OSError
    assert code_1 == 1 and len(lines_1) == 1, lines_1
    assert "global rank 0 could not write the model to model_dir" in lines_1[0] and FULL in lines_1[0]
    # at once: rank 1 learns it from rank 0's answer, not from the collective's timeout
    assert ended_1 - failed_at < DIST_TIMEOUT_S / 4
    assert not os.path.exists(os.path.join(ranks[2], "model", "model.pt"))


def test_model_dir_in_s3_is_refused_in_one_line_before_anything_trains(as_script, tmp_path, monkeypatch, capsys):
    for name in [n for n in os.environ if n.startswith(("SM_", "SAGEMAKER_"))]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    trained = []

    class Recording(BoringModel):
        def training_step(self, batch, batch_idx):
            trained.append(batch_idx)
            return super().training_step(batch, batch_idx)

    with pytest.raises(SystemExit) as exit:
        as_script(LightningCLI, Recording, args=["fit", *TINY, "--model_dir=s3://bucket/x"], save_config_callback=None)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ERROR: ")]
    assert exit.value.code == 1 and len(errors) == 1, errors
    assert "model_dir=s3://bucket/x is not a local directory" in errors[0] and "leave it unset" in errors[0]
    assert trained == []
