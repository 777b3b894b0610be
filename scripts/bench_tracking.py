"""MLflow tracking's own cost per training step, alone: the tracking callback's hook on the training thread
(tracking.Tracker.step_end: the loss, the rate, a queued point) and the run's thread that sends the points
(mlflow_run.Run), against a real server. Each step is a 1 ms sleep (a step whose compute leaves the CPU, as a GPU's
does); the process's CPU time per step is compared with the same loop without tracking, at each logging cadence.
The last line is machine-readable:
  bench-tracking: hook_us_<n>=<µs a call> cpu_us_<n>=<extra CPU µs a step> ...

    .venv/bin/mlflow server --host 127.0.0.1 --port 5000 --backend-store-uri sqlite:////tmp/mlflow.db &
    .venv/bin/python scripts/bench_tracking.py --uri http://127.0.0.1:5000
"""

import argparse
import os
import platform
import sys
import time
import timeit
from types import SimpleNamespace

import machine


def loop(steps: int, hook) -> float:
    """The process's CPU seconds for `steps` steps of a 1 ms sleep, each followed by `hook(step)`."""
    start = time.process_time()
    for step in range(1, steps + 1):
        time.sleep(0.001)
        hook(step)
    return time.process_time() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uri", required=True, help="an MLflow server (`mlflow server`)")
    parser.add_argument("--steps", type=int, default=5000, help="steps of each loop")
    parser.add_argument("--every", type=int, nargs="+", default=[50, 1], help="log_every_n_steps to measure")
    args = parser.parse_args()

    import lightning.pytorch as pl
    import mlflow
    import torch

    from sagemaker_lightning.toolbox import lightning_package
    from sagemaker_lightning.tracking import mlflow_run
    from sagemaker_lightning.tracking import tracker as tracking

    print(
        f"date: {time.strftime('%Y-%m-%d')}; {machine.cpu()}, {len(os.sched_getaffinity(0))} cores; Python {platform.python_version()}, torch "
        f"{torch.__version__}, lightning {pl.__version__}, mlflow {mlflow.__version__}"
    )
    outputs, batch = torch.tensor(0.5), (torch.zeros(32, 4), torch.zeros(32))
    summary = []
    for every in args.every:
        tracker = lightning_package.made(tracking.Tracker, pl)(
            args.uri, "bench-tracking", None, {}, "h", None, False, False, str
        )
        tracker.run = mlflow_run.Run(
            uri=args.uri,
            experiment="bench-tracking",
            name=f"every-{every}",
            tags={},
            continues=None,
            opened=lambda *_: None,
        )
        assert tracker.run.is_open.wait(60), f"{args.uri} did not answer"
        trainer = SimpleNamespace(global_step=0, log_every_n_steps=every, world_size=1)
        tracker._since = (time.monotonic(), 0)

        def hook(step, tracker=tracker, trainer=trainer):
            trainer.global_step = step
            tracker.step_end(trainer, step, outputs, batch)

        # a call at a step that logs (every 1), else at one that does not; 2,000 calls stay below the run's queue limit
        step, calls = (7, 2000) if every == 1 else (7 * every + 1, 20000)
        hook_us = timeit.timeit(lambda hook=hook, step=step: hook(step), number=calls) / calls * 1e6
        base = loop(args.steps, lambda step: None)
        tracked = loop(args.steps, hook)
        tracker.run.finish("FINISHED", wait_s=60)
        extra = (tracked - base) / args.steps * 1e6
        print(
            f"log_every_n_steps {every}: the hook {hook_us:.2f} µs a call; CPU {tracked / args.steps * 1e6:.1f} vs "
            f"{base / args.steps * 1e6:.1f} µs a step without tracking: {extra:+.1f} µs a step"
        )
        summary += [f"hook_us_{every}={hook_us:.2f}", f"cpu_us_{every}={extra:.1f}"]
    print("bench-tracking: " + " ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
