"""One training run of app/example/train.py in this process, measured; prints one line `throughput: {json}`.

It measures images/s over `--steps` optimizer steps after `--warmup` steps (compilation, allocator and kernel
warm-up, worker start-up happen there), seconds from `--started` (the launcher's clock when it started this process)
to the end of the first optimizer step, peak host memory of this process and peak device memory.
With --model-only the same model, trainer and precision train on one synthetic batch already on the device: the
data pipeline costs nothing. scripts/benchmark.py runs this once per path, each in a fresh process.

    python scripts/throughput.py --warmup 2 --steps 5 -- --data.data_dir data/bench/10000 --trainer.devices 1
"""

import argparse
import itertools
import json
import os
import platform
import sys
import time

STARTED = time.time()  # without --started: this process's start, less the interpreter's own start-up

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "app", "example"))

import pytorch_lightning as pl  # noqa: E402 (after the path to the example)
import torch  # noqa: E402
import torchvision  # noqa: E402

import machine  # noqa: E402 (beside this script)
import train  # noqa: E402 (the example's)
from sagemaker_lightning.checkpoints.last import LastCheckpoint  # noqa: E402
from sagemaker_lightning.cli import precision  # noqa: E402

# torch and oneDNN held below the CPU's instruction set (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 emulate an
# AVX2-only CPU): reported with the figures
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


class Meter(pl.Callback):
    """Times the first optimizer step from process start, and `steps` steps after `warmup` steps."""

    def __init__(self, warmup: int, steps: int, started: float):
        self.warmup, self.steps, self.started = warmup, steps, started
        self.first_step_s = self.seconds = None
        self.images = 0

    @staticmethod
    def _sync(trainer: pl.Trainer) -> None:
        """Wait for the device: CUDA runs ahead of Python, so a clock read alone would time the launches only."""
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        done = trainer.global_step  # optimizer steps so far
        if self.first_step_s is None:
            self._sync(trainer)
            self.first_step_s = time.time() - self.started
        if done == self.warmup:
            self._sync(trainer)
            self._t0 = time.perf_counter()
        elif done > self.warmup:
            self.images += len(batch[1]) * trainer.world_size
        if done == self.warmup + self.steps:
            self._sync(trainer)
            self.seconds = time.perf_counter() - self._t0


class SyntheticBatches(pl.LightningDataModule):
    """One random batch made once on the training device, served for every step: a data pipeline that costs nothing."""

    def __init__(self, batch_size: int, num_classes: int, steps: int):
        super().__init__()
        self.batch_size, self.num_classes, self.steps = batch_size, num_classes, steps

    def setup(self, stage: str) -> None:
        device = self.trainer.strategy.root_device
        # channels last in memory, as DeviceCIFAR10DataModule's batches are: the model gets the same layout
        self.x = torch.randn(self.batch_size, 3, 32, 32, device=device).contiguous(memory_format=torch.channels_last)
        self.y = torch.randint(0, self.num_classes, (self.batch_size,), device=device)

    def train_dataloader(self) -> "Repeat":
        return Repeat((self.x, self.y), self.steps)


class Repeat:
    """One batch `times` times (a list would not do: Lightning reads a list as a list of data loaders)."""

    def __init__(self, batch, times: int):
        self.batch, self.times = batch, times

    def __len__(self) -> int:
        return self.times

    def __iter__(self):
        return itertools.repeat(self.batch, self.times)


def hardware() -> dict:
    probed = precision.probe("cpu")
    return {
        "cpu": machine.cpu(),
        "cpu_capability": probed.cpu_capability,  # torch.backends.cpu.get_cpu_capability()
        "cpu_bf16": probed.cpu_bf16,
        "isa_limits": {key: os.environ[key] for key in ISA_LIMITS if key in os.environ},
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "lightning": pl.__version__,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
    }


def peak_rss_mib() -> float:
    """This process's peak resident memory: VmHWM, which starts afresh at exec; ru_maxrss would carry over the
    peak of the parent that forked this process (the benchmark, holding the generated data)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024  # kB


def measure(train_args: list[str], warmup: int, steps: int, started: float, model_only: bool) -> dict | None:
    # validation and checkpoints are per-epoch work: off, so that an epoch's end inside the timed steps adds nothing
    cli = train.main(
        train_args
        + ["--trainer.max_steps", str(warmup + steps), "--trainer.max_epochs", "-1", "--trainer.limit_val_batches", "0"]
        + ["--checkpoint.save_top_k", "0", "--checkpoint.save_last", "false"],
        run=False,
    )
    # nor last.ckpt (every N steps and at each epoch end): the default path would save at its epoch ends, model_only
    # (one long epoch) would not, and each save costs what the disk makes it cost
    cli.trainer.callbacks = [c for c in cli.trainer.callbacks if not isinstance(c, LastCheckpoint)]
    meter = Meter(warmup, steps, started)
    cli.trainer.callbacks.append(meter)
    data = cli.datamodule
    if model_only:
        data = SyntheticBatches(data.batch_size, data.num_classes, warmup + steps)
    cli.trainer.fit(cli.model, data)
    if meter.seconds is None:
        raise SystemExit(f"error: training ended after {cli.trainer.global_step} steps, before {warmup + steps}")
    if not cli.trainer.is_global_zero:
        return None  # every process measured the same steps; one prints them
    device = cli.trainer.strategy.root_device
    return {
        "images_per_s": meter.images / meter.seconds,
        "images": meter.images,  # in the timed steps, every rank's
        "first_step_s": meter.first_step_s,
        "peak_host_mib": peak_rss_mib(),
        "peak_device_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        "device": str(device),
        "batch_size": cli.datamodule.batch_size,
        "data": "synthetic, on the device" if model_only else type(cli.datamodule).__name__,
        "precision": cli.trainer.precision,
        "precision_line": cli.precision.line(),  # chosen for the machine, or set
        "channels_last": cli.model.hparams.channels_last,
        "compile": cli.model.hparams.compile,
        "hardware": hardware(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warmup", type=int, default=2, help="optimizer steps before the clock starts (at least 1)")
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps timed")
    parser.add_argument(
        "--started", type=float, default=STARTED, help="epoch seconds when the launcher started this process"
    )
    parser.add_argument("--model-only", action="store_true", help="train on one synthetic batch already on the device")
    parser.add_argument("train_args", nargs="*", help="app/example/train.py arguments, after --")
    args = parser.parse_args()
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be at least 1: the first step always does one-off work")
    result = measure(args.train_args, args.warmup, args.steps, args.started, args.model_only)
    if result:
        print("throughput: " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
