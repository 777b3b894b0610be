"""What a trainer says while it trains: who-is-who at the start, plain progress and validation lines (their formats
and the metric definitions that read them: lines.py), and the weights each rank ends with. Each is a mixin made into
a Callback of the project's Lightning package (lightning_package.made).

    python app/example/train.py ... | cat          # no terminal: progress lines (first step, every 30 s, every log_every_n_steps)
"""

import dataclasses
import datetime
import hashlib
import sys
import time
from collections.abc import Mapping

import torch
from torch.distributed.tensor import DTensor

from sagemaker_lightning import lines
from sagemaker_lightning.lines import say
from sagemaker_lightning.toolbox.concern import Context, Part
from sagemaker_lightning.toolbox.lightning_package import made


def weights_digest(module: torch.nn.Module) -> str:
    """A short fingerprint of all weights: equal on every rank when data-parallel training kept them in sync. Sharded
    weights (fsdp) are gathered one at a time, so every rank must call it. Bytes, not numpy arrays: numpy has no
    bfloat16 (bf16-true weights)."""
    h = hashlib.sha256()
    for tensor in module.state_dict().values():
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        h.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def batch_size(batch) -> int | None:
    """The first dimension of the first tensor in `batch`, depth first through dicts, lists, tuples and dataclasses;
    None where there is none (a batch of a type no walk knows: a graph library's, strings)."""
    if isinstance(batch, torch.Tensor):
        return len(batch) if batch.ndim else None
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        batch = [getattr(batch, field.name) for field in dataclasses.fields(batch)]
    elif isinstance(batch, Mapping):
        batch = batch.values()
    elif not isinstance(batch, list | tuple):
        return None
    return next((n for n in map(batch_size, batch) if n is not None), None)


def rate(batch, world_size: int, steps: int, seconds: float) -> tuple[str, float]:
    """What the training counts per second, and how many: "images" (each batch's first dimension, the same on every
    rank: full batches only) or "batches" where a batch has no tensor, over `steps` steps of `seconds` (a coarse
    clock may not move in a step)."""
    size = batch_size(batch)
    counted, size = ("images", size) if size is not None else ("batches", 1)
    return counted, size * world_size * steps / max(seconds, 1e-9)


def eta(total, step: int, seconds_per_step: float) -> str:
    """The time the steps from `step` to `total` take at `seconds_per_step`, as H:MM:SS; a step past the total shows
    0:00:00. "?" where no such time exists: a total that is not a count (inf, nan, negative) or a time beyond what
    timedelta holds (trainer.max_steps=sys.maxsize with an iterable loader overflowed it: OverflowError)."""
    if not total >= 0:  # negative, nan
        return "?"
    try:
        return str(datetime.timedelta(seconds=round(max(total - step, 0) * seconds_per_step)))
    except OverflowError:  # inf; beyond a float or a timedelta
        return "?"


def loss(outputs) -> float | None:
    """The loss a training step returned (Lightning's outputs: a tensor, or a dict's "loss"), or None: a step that
    returned None (a skipped batch), manual optimization's step that returned no loss."""
    if isinstance(outputs, Mapping):
        outputs = outputs.get("loss")
    return outputs.item() if isinstance(outputs, torch.Tensor) and outputs.numel() == 1 else None


class RankReport:
    """Each process says which rank it is at the start and which weights it ends with; global rank 0 adds the
    validation line, and in a tuning job's child says which metric the tuner ranks (lines.objective) and, after the
    first validation, whether that line holds it (lines.unprinted): the tuner reads every host's log, so once."""

    BASE = "callbacks.Callback"

    def __init__(self, host: str, objective: str | None = None):
        self.host = host  # SageMaker's name for this host (algo-N), else the machine's
        self.objective = objective  # a tuning job's (Plan.objective)
        self._unchecked = objective  # the objective, until the first validation line is checked for it

    def _say(self, trainer, what: str) -> None:
        say(f"rank {trainer.global_rank}/{trainer.world_size} host {self.host}: {what}")

    def setup(self, trainer, pl_module, stage):
        self._say(trainer, f"node_rank {trainer.node_rank} local_rank {trainer.local_rank}")
        if self.objective and trainer.is_global_zero:
            say(lines.objective(self.objective))

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.is_global_zero and not trainer.sanity_checking:
            line = lines.validation(trainer.current_epoch, trainer.global_step, trainer.callback_metrics)
            say(line)
            if self._unchecked and (warning := lines.unprinted(self._unchecked, line)):
                say(warning)
            self._unchecked = None

    def on_fit_end(self, trainer, pl_module):
        self._say(trainer, f"weights {weights_digest(pl_module)} at step {trainer.global_step}")


class LogLines:
    """Where there is no progress bar (stdout is not a terminal: CloudWatch, SageMaker's log streams), rank 0 prints
    `epoch E step S/T: train/loss=L images/s=R eta=H:MM:SS [hosts: slowest H Rx the median]`, one plain line each,
    instead of carriage-return progress bars: after the first step (its rate includes the first step's one-off
    work), then every trainer.log_every_n_steps steps and whenever `every_s` seconds have passed since the last line,
    so that a log never stays silent for long, whatever the run's length (a single step longer than that: a line per
    step). Images are each batch's first dimension (batch_size), batches/s in their place where a batch has no
    tensor; train/loss only where the step returned one (loss)."""

    BASE = "callbacks.Callback"

    def __init__(self, every_s: float = 30.0, clock=time.monotonic, status=None):
        """status: the process's (toolbox/status.py), whose `spread` the watchdog writes, if anywhere."""
        self.every_s, self.clock, self.status = every_s, clock, status

    def on_train_start(self, trainer, pl_module):
        self._since = (self.clock(), trainer.global_step)
        self._first = trainer.global_step + 1  # a resumed run's first step too
        self._silent = trainer.progress_bar_callback is not None or not trainer.is_global_zero  # once, not every step

    def step_end(self, trainer, step, outputs, batch):  # toolbox/concern.py's Steps calls it
        if self._silent or step == self._since[1]:
            return
        now, (then, then_step), n = self.clock(), self._since, trainer.log_every_n_steps
        if not (step == self._first or (n and step % n == 0) or now - then >= self.every_s):
            return
        self._since = (now, step)
        seconds_per_step = max(now - then, 1e-9) / (step - then_step)  # a coarse clock may not move in a step
        counted, per_s = rate(batch, trainer.world_size, step - then_step, now - then)
        total = trainer.estimated_stepping_batches
        spread = self.status.spread if self.status else ""
        left = eta(total, step, seconds_per_step)
        say(lines.progress(trainer.current_epoch, step, total, loss(outputs), per_s, left, spread, counted))


def concern(ctx: Context) -> Part:
    """In a job: RankReport and LogLines (the hosts' spread from the process's Status), and no progress bar where
    stdout is not a terminal (carriage returns make a mess of log files) unless the project asks for one."""
    if not ctx.plan.in_job:
        return Part()
    bar = {} if ctx.trainer.get("enable_progress_bar") is not None else {"enable_progress_bar": sys.stdout.isatty()}
    lines = [made(RankReport, ctx.pl)(ctx.plan.host, ctx.plan.objective), made(LogLines, ctx.pl)(status=ctx.status)]
    return Part(callbacks=lines, arguments=bar)
