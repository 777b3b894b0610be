"""One training run of scripts/bench_overhead.py, in this process (and in the processes Lightning's launcher starts for
local ranks 1.., with the same command line and environment): the CLI named by BENCH_OVERHEAD_CLI ("lightning", or the
runtime's: "runtime", "mlflow") trains a negligible model; rank 0 writes what it measured to BENCH_OVERHEAD_OUT.

    BENCH_OVERHEAD_CLI=lightning BENCH_OVERHEAD_OUT=/tmp/out.json python scripts/bench_overhead_run.py fit \
        --trainer.max_epochs 1 --trainer.logger false --model.steps 300
"""

import json
import os
import sys
import time


def child(cli: str, out: str) -> None:
    """One training run: the CLI's arguments are the command line's."""
    import lightning.pytorch as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(L.LightningModule):
        def __init__(self, steps: int = 2150, warmup: int = 100, batch_size: int = 32):
            """
            Args:
                steps: training steps of each process (one epoch).
                warmup: steps before the timing starts.
                batch_size: samples per step and process.
            """
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))

        def train_dataloader(self):
            n = self.hparams.steps * self.hparams.batch_size * self.trainer.world_size
            data = TensorDataset(torch.randn(n, 4), torch.randint(0, 2, (n,)))
            return DataLoader(data, batch_size=self.hparams.batch_size, shuffle=True)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            # the window ends at the last step's end: the epoch's end after it (each CLI's checkpoint save, 0.1-0.2 s
            # here, which cProfile puts at 0.1 ms a step of the window) is no step's cost
            if self.trainer.global_step in (self.hparams.warmup, self.hparams.steps):
                self.timed = [*getattr(self, "timed", ()), (time.perf_counter(), time.process_time())]

        def on_train_end(self):
            if self.trainer.is_global_zero:
                steps = self.trainer.global_step - self.hparams.warmup
                (wall0, cpu0), (wall1, cpu1) = self.timed
                result = {"steps_per_s": steps / (wall1 - wall0), "cpu_us_per_step": (cpu1 - cpu0) / steps * 1e6}
                if profile:
                    result["hooks"] = hook_costs(self.trainer)
                with open(out, "w") as f:
                    json.dump(result, f)

    if cli == "lightning":
        from lightning.pytorch.cli import LightningCLI
    else:  # "runtime", "mlflow": the runtime's, the second with a job's MLflow run (MLFLOW_TRACKING_URI)
        from sagemaker_lightning import LightningCLI
    profile = "simple" in sys.argv  # --trainer.profiler simple
    LightningCLI(Tiny, seed_everything_default=0)


def hook_costs(trainer) -> dict[str, float]:
    """µs per step of each callback's per-step hooks (those called at every step; not setup, the epoch's end or its
    checkpoint) and of fetching a batch, from the SimpleProfiler's records."""
    steps = trainer.global_step
    costs: dict[str, float] = {}
    for action, durations in trainer.profiler.recorded_durations.items():
        if action.startswith("[Callback]"):
            name = action.removeprefix("[Callback]").split("{")[0].split(".")[0]  # ModelCheckpoint{...}.on_...
        elif action.endswith("train_dataloader_next"):
            name = "fetching a batch"
        else:
            continue
        if len(durations) >= steps:
            costs[name] = costs.get(name, 0.0) + sum(durations) / steps * 1e6
    return costs


if __name__ == "__main__":
    child(os.environ["BENCH_OVERHEAD_CLI"], os.environ["BENCH_OVERHEAD_OUT"])
