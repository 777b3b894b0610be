"""What a trainer says while it trains: who-is-who at the start, plain progress and validation lines (their formats
and the metric definitions that read them: lines.py), and the weights each rank ends with. Each is a mixin made into
a Callback of the project's Lightning package (flavor.made).

    python app/example/train.py ... | cat          # no terminal: progress lines (first step, every 30 s, every log_every_n_steps)
"""

import datetime
import hashlib
import sys
import time

import torch
from torch.distributed.tensor import DTensor

from sagemaker_lightning import lines
from sagemaker_lightning.flavor import made
from sagemaker_lightning.lines import say


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


class RankReport:
    """Each process says which rank it is at the start and which weights it ends with; rank 0 adds val metrics."""

    BASE = "callbacks.Callback"

    def __init__(self, host: str):
        self.host = host  # SageMaker's name for this host (algo-N), else the machine's

    def _say(self, trainer, what: str) -> None:
        say(f"rank {trainer.global_rank}/{trainer.world_size} host {self.host}: {what}")

    def setup(self, trainer, pl_module, stage):
        self._say(trainer, f"node_rank {trainer.node_rank} local_rank {trainer.local_rank}")

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.is_global_zero and not trainer.sanity_checking:
            say(lines.validation(trainer.current_epoch, trainer.global_step, trainer.callback_metrics))

    def on_fit_end(self, trainer, pl_module):
        self._say(trainer, f"weights {weights_digest(pl_module)} at step {trainer.global_step}")


class LogLines:
    """Where there is no progress bar (stdout is not a terminal: CloudWatch, SageMaker's log streams), rank 0 prints
    `epoch E step S/T: train/loss=L images/s=R eta=H:MM:SS [hosts: slowest H Rx the median]`, one plain line each,
    instead of carriage-return progress bars: after the first step (its rate includes the first step's one-off
    work), then every trainer.log_every_n_steps steps and whenever `every_s` seconds have passed since the last line,
    so that a log never stays silent for long, whatever the run's length (a single step longer than that: a line per
    step)."""

    BASE = "callbacks.Callback"

    def __init__(self, every_s: float = 30.0, clock=time.monotonic, hosts=None):
        """hosts: where the line's words on the hosts' spread are (watchdog.Watchdog's `spread`), if anywhere."""
        self.every_s, self.clock, self.hosts = every_s, clock, hosts

    def on_train_start(self, trainer, pl_module):
        self._since = (self.clock(), trainer.global_step)
        self._first = trainer.global_step + 1  # a resumed run's first step too
        self._silent = trainer.progress_bar_callback is not None or not trainer.is_global_zero  # once, not every step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if self._silent or step == self._since[1]:
            return
        now, (then, then_step), n = self.clock(), self._since, trainer.log_every_n_steps
        if not (step == self._first or (n and step % n == 0) or now - then >= self.every_s):
            return
        self._since = (now, step)
        seconds_per_step = (now - then) / (step - then_step)
        images = len(batch[0]) * trainer.world_size  # every rank's batch has this size (full batches only)
        total = trainer.estimated_stepping_batches
        eta = datetime.timedelta(seconds=round((total - step) * seconds_per_step)) if total != float("inf") else "?"
        loss = outputs["loss"].item()
        spread = self.hosts.spread if self.hosts else ""
        say(lines.progress(trainer.current_epoch, step, total, loss, images / seconds_per_step, eta, spread))


def callbacks(pl, plan, hosts=None) -> list:
    """RankReport and LogLines, on SageMaker; `hosts`: where the progress line's words on the hosts' spread are (the
    watchdog)."""
    if not plan.on_sagemaker:
        return []
    return [made(RankReport, pl)(plan.host), made(LogLines, pl)(hosts=hosts)]


def arguments(plan, trainer: dict) -> dict:
    """On SageMaker, no progress bar where stdout is not a terminal (carriage returns make a mess of log files) unless
    the project asks for one: the progress lines take its place."""
    if not plan.on_sagemaker or trainer.get("enable_progress_bar") is not None:
        return {}
    return {"enable_progress_bar": sys.stdout.isatty()}
