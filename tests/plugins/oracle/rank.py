"""One rank of one run of the oracle's small job (project.py), in a process of its own that the oracle's fork server
started (runs.py): the job's variables as its platform sets them (SageMaker's hosts, or torchrun's processes on one
host), the runtime's LightningCLI with checkpoints, and the interruption a Fault says: SIGTERM or SIGKILL at a
hook, inside a checkpoint's background write, or around the stop agreement's all-reduce.

The rank appends what it trains to records-<rank>.jsonl as it goes (a SIGKILL keeps what came before it): each
step's ids and loss, each epoch's start, the moment of its signal; a rank that ends normally saves its weights.

    .venv/bin/python -c "from oracle import rank; help(rank.Fault)"
"""

import atexit
import functools
import json
import multiprocessing
import os
import signal
import sys
from dataclasses import dataclass

# what a run imports besides (TensorBoard: the runtime's default logger; the S3 clients: its checkpoint IO; litdata;
# Lightning's CLI), imported once in the fork server, not in every run: 0.8 s a run
import boto3  # noqa: F401, I001
import lightning.pytorch
import lightning.pytorch.cli  # noqa: F401
import litdata  # noqa: F401
import omegaconf  # noqa: F401
import pytorch_lightning
import s3fs  # noqa: F401
import torch
import torch.utils.tensorboard  # noqa: F401
from torch.distributed.checkpoint import FileSystemWriter

from oracle import project
from sagemaker_lightning import LightningCLI
from sagemaker_lightning.boot import signals
from sagemaker_lightning.data.resumable import ResumableEpoch
from sagemaker_lightning.data.training_loader import TrainingLoader
from sagemaker_lightning.stop import process
from sagemaker_lightning.stop.agreement import StopTogether
from sagemaker_lightning.toolbox.lightning_package import made

PACKAGES = {"lightning.pytorch": lightning.pytorch, "pytorch_lightning": pytorch_lightning}
SETTINGS = (  # 2 epochs, a validation every 2 steps and at each epoch's end, last.ckpt every 3 steps too
    "--trainer.max_epochs=2",
    "--trainer.accelerator=cpu",
    "--trainer.precision=32-true",
    "--trainer.logger=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.val_check_interval=2",
    "--last_checkpoint_every_n_steps=3",
    "--preflight=off",
    "--dist_timeout=60",
)


@dataclass(frozen=True)
class Fault:
    """A signal this rank sends: `action` (SIGTERM to itself; SIGKILL to itself, or "SIGKILL all": to every rank of
    the run at once, the host lost) at `where` (a Lightning hook; "write": inside the background write of the save at
    `step`; "before agreement" or "after agreement": around the stop agreement's all-reduce) when the trainer's
    global step is `step`, its epoch `epoch`, the validation batch `batch`, in the sanity check or not (`sanity`), in a
    validation (`validating`: None, either)."""

    action: str
    where: str
    step: int | None = None
    epoch: int | None = None
    batch: int | None = None
    sanity: bool = False
    validating: bool | None = None

    def due(self, trainer, batch_idx=None) -> bool:
        return (
            (self.step is None or trainer.global_step == self.step)
            and (self.epoch is None or trainer.current_epoch == self.epoch)
            and (self.batch is None or batch_idx == self.batch)
            and trainer.sanity_checking == self.sanity
            and (self.validating is None or trainer.validating == self.validating)
        )


@dataclass(frozen=True)
class Pipeline:
    """A project's data: its Lightning package, its data module (a class of project.py) and its arguments."""

    package: str
    data: str
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Run:
    """One run of the job (one attempt of a chain) on `world` ranks."""

    workdir: str  # the job's folder: checkpoints, model, records, logs
    world: int
    topology: str  # "1-process", "2-processes" (torchrun on one host), "2-hosts" (SageMaker's, one process each)
    port: int
    pipeline: Pipeline
    agree_every_s: float  # the stop agreement's interval: far shorter than a step (slow steps) or far longer
    faults: tuple[tuple[int, Fault], ...] = ()  # (rank, fault)
    mutation: str | None = None  # a defect put into the runtime (MUTATIONS), to show the oracle finds it


class Recorder:
    """What this rank trains, appended as it goes: {"step", "epoch", "ids", "loss"} a step, {"epoch start"},
    {"validated": the step a validation ran at}."""

    BASE = "callbacks.Callback"

    def __init__(self, path: str):
        self.file = open(path, "a", buffering=1)  # noqa: SIM115 (open for the process's life: a SIGKILL ends it)

    def write(self, **record) -> None:
        self.file.write(json.dumps(record) + "\n")

    def on_train_epoch_start(self, trainer, pl_module):
        self.write(**{"epoch start": trainer.current_epoch})

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        ids = [int(i) for i in batch[1]]
        self.write(step=trainer.global_step - 1, epoch=trainer.current_epoch, ids=ids, loss=float(outputs["loss"]))

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.write(validated=trainer.global_step)


class Interrupt:
    """Sends its Fault's signal once, when due, and records the moment (the oracle's promptness check)."""

    BASE = "callbacks.Callback"
    HOOKS = ("on_train_start", "on_train_epoch_start", "on_train_epoch_end", "on_validation_start", "on_validation_end")
    HOOKS += ("on_train_batch_start", "on_train_batch_end", "on_save_checkpoint")

    def __init__(self, fault: Fault, recorder: Recorder):
        self.fault, self.recorder, self.sent = fault, recorder, False
        if fault.where in self.HOOKS:  # its own hook only: Lightning calls what a callback has
            setattr(self, fault.where, functools.partial(self.fire, fault.where, None))

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.fire("on_validation_batch_start", batch_idx, trainer)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.fire("on_validation_batch_end", batch_idx, trainer)

    def fire(self, hook: str, batch_idx, trainer, *args) -> None:
        if hook == self.fault.where and not self.sent and self.fault.due(trainer, batch_idx):
            self.send(trainer, in_step=hook == "on_train_batch_start")  # that step goes ahead

    def setup(self, trainer, pl_module, stage):
        if self.fault.where == "write":
            self._in_writes(trainer)
        elif self.fault.where.endswith("agreement"):
            self._around_agreement(trainer)

    def _in_writes(self, trainer) -> None:
        """The signal inside the writer thread's write of the save at the fault's step: a whole file's (torch.save of
        last.ckpt's partial file) or fsdp's shards (DCP's FileSystemWriter); a SIGKILL once half of it is written."""
        save, write_shards = torch.save, FileSystemWriter.write_data

        def cut(write, paths):
            if self.fault.action == "SIGTERM":
                self.send(trainer)  # the handler runs in the training thread, the write goes on
                return write()
            written = write()
            for path in paths():
                os.truncate(path, os.path.getsize(path) // 2)
            self.send(trainer)
            return written

        def saving(obj, f, *args, **kwargs):
            if os.path.basename(str(f)) == ".last.ckpt.partial" and obj.get("global_step") == self.fault.step:
                return cut(lambda: save(obj, f, *args, **kwargs), lambda: [f])
            return save(obj, f, *args, **kwargs)

        def writing_shards(storage, plan, planner):
            folder = str(storage.path)

            def shards():
                return [os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".distcp")]

            if f"step-{self.fault.step:09d}-" in folder:
                return cut(lambda: write_shards(storage, plan, planner), shards)
            return write_shards(storage, plan, planner)

        torch.save, FileSystemWriter.write_data = saving, writing_shards

    def _around_agreement(self, trainer) -> None:
        """The signal just before the stop agreement's all-reduce at the fault's step (it stops there), or just after
        it (the step goes ahead; the next agreement stops it)."""
        agree, before = StopTogether.agree, self.fault.where.startswith("before")

        def agreeing(stop, trainer, proposal=1):
            due = self.fault.due(trainer) and not trainer.validating and not self.sent
            if due and before:
                self.send(trainer)
            agreed = agree(stop, trainer, proposal)
            if due and not before:
                self.send(trainer, in_step=True)
            return agreed

        StopTogether.agree = agreeing

    def send(self, trainer, in_step: bool = False) -> None:
        self.sent = True
        self.recorder.write(signal=self.fault.action, step=trainer.global_step, in_step=in_step)
        if self.fault.action == "SIGTERM":
            os.kill(os.getpid(), signal.SIGTERM)
            return
        pids = [os.getpid()]
        if self.fault.action == "SIGKILL all":  # the host lost: every rank of the run, this one last
            with open("pids") as f:
                pids = [int(p) for p in f.read().split() if int(p) != os.getpid()] + pids
        for pid in pids:
            os.kill(pid, signal.SIGKILL)


def _late_count() -> None:
    """The loader's position counts the epoch before until the next epoch's first batch (the defect of issue 55)."""
    position = ResumableEpoch._position
    ResumableEpoch._position = lambda self: position(self) if self._resume else (self.sampler.epoch, self._counted[1])


def _no_epoch_end_agreement() -> None:
    """The ranks do not agree after an epoch's end hooks."""
    between = StopTogether._between_epochs

    def without(self, trainer):
        between(self, trainer)
        del trainer.fit_loop.on_advance_end  # the class's own again

    StopTogether._between_epochs = without


def _seeded_not_restored() -> None:
    """A resumed run seeds its generators at its first batch instead of setting back the checkpoint's states."""
    load = ResumableEpoch.load_state_dict

    def without(self, state):
        load(self, {k: v for k, v in state.items() if k != "draws"})

    ResumableEpoch.load_state_dict = without


def _validation_draws_leak() -> None:
    """A validation draws from training's generators: nothing holds their state aside meanwhile."""
    TrainingLoader.on_validation_start = TrainingLoader.on_validation_end = lambda self, trainer, pl_module: None


MUTATIONS = {
    "late-count": _late_count,
    "no-epoch-end-agreement": _no_epoch_end_agreement,
    "seeded-not-restored": _seeded_not_restored,
    "validation-draws-leak": _validation_draws_leak,
}


def environment(run: Run, rank: int) -> dict:
    """The variables the platform gives this rank: SageMaker's (one host a process), or torchrun's."""
    base = run.workdir
    if run.topology == "2-processes":
        return {
            "TORCHELASTIC_RUN_ID": "oracle", "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0",
            "WORLD_SIZE": str(run.world), "LOCAL_WORLD_SIZE": str(run.world), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(run.port),
        }  # fmt: skip
    hosts = ["localhost", "127.0.0.1"][: run.world]
    return {
        "SM_HOSTS": json.dumps(hosts), "SM_CURRENT_HOST": hosts[rank], "SM_NUM_GPUS": "0", "MASTER_PORT": str(run.port),
        "SAGEMAKER_BASE_DIR": base, "SM_MODEL_DIR": os.path.join(base, "model"), "SM_OUTPUT_DIR": os.path.join(base, "output"),
        "SM_OUTPUT_DATA_DIR": os.path.join(base, "output", "data"), "SM_INPUT_CONFIG_DIR": os.path.join(base, "config"),
    }  # fmt: skip


def rank_main(rank: int, run: Run) -> None:
    """One rank of `run`, in a process of the oracle's fork server; exits with the job's exit code."""
    os.setpgid(0, 0)  # its DataLoader workers with it: the oracle ends what a killed rank leaves
    multiprocessing.set_start_method("fork", force=True)  # a job's process's own (the server's are another)
    os.chdir(run.workdir)
    log = os.open(f"log-{rank}", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    for name in [n for n in os.environ if n.startswith(("SM_", "SAGEMAKER_", "TORCHELASTIC"))]:
        del os.environ[name]
    os.environ.update(environment(run, rank))
    os.makedirs("output", exist_ok=True)
    torch.set_num_threads(1)
    signals.forwarded = lambda: True  # as under the image's entrypoint, which passes SIGTERM on
    signals.RUN_DIR = os.path.join(run.workdir, "run")
    process.SETTLE_S = 0  # the process ends with os._exit: nothing left to settle
    StopTogether.AGREE_EVERY_S = run.agree_every_s  # steps slower than it (an agreement each) or far faster
    if run.mutation:
        MUTATIONS[run.mutation]()
    pl = PACKAGES[run.pipeline.package]
    data = getattr(project, run.pipeline.data)
    recorder = made(Recorder, pl)(f"records-{rank}.jsonl")
    callbacks = [recorder, *(made(Interrupt, pl)(fault, recorder) for r, fault in run.faults if r == rank)]
    args = [*SETTINGS, *run.pipeline.args]
    if run.topology == "2-processes":  # torchrun's job has no SageMaker paths
        args += ["--checkpoint.dirpath=checkpoints", "--model_dir=model"]
    code = 0
    try:
        try:
            cli = LightningCLI(
                made(project.Tiny, pl), data if issubclass(data, pl.LightningDataModule) else made(data, pl),
                seed_everything_default=0, save_config_callback=None, trainer_defaults={"callbacks": callbacks},
                args=args,
            )  # fmt: skip
        except Exception as e:  # as a script ends: the runtime's excepthook says the line and exits
            sys.excepthook(type(e), e, e.__traceback__)
        weights = {k: getattr(v, "to_local", lambda v=v: v)().clone() for k, v in cli.model.state_dict().items()}
        torch.save(weights, f"weights-{rank}.pt")  # fsdp: this rank's shards (the process group is gone)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    atexit._run_exitfuncs()  # as the process's end runs them (os._exit: not the interpreter's finalization)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
