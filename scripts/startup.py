"""Seconds from `docker run` to the first optimizer step, started as SageMaker starts the image: the entrypoint,
the training toolkit's `train`, launch.py, then train.py importing, loading the data and setting up DDP.

    python scripts/startup.py --image sagemaker-lightning:latest          # make bench-startup
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import make_dataset


def opt_ml(root: str, train_images: int) -> str:
    """What SageMaker writes before it starts a container: one host, the training channel, the hyperparameters."""
    config = os.path.join(root, "input", "config")
    os.makedirs(config)
    files = {
        "resourceconfig.json": {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0"},
        "inputdataconfig.json": {"training": {"TrainingInputMode": "File"}},
        # one progress line per step; two steps and no validation: the run ends right after what is measured
        "hyperparameters.json": {
            "trainer.log_every_n_steps": "1",
            "trainer.limit_train_batches": "2",
            "trainer.limit_val_batches": "0",
            "trainer.max_epochs": "1",
        },
    }
    for name, content in files.items():
        with open(os.path.join(config, name), "w") as f:
            json.dump(content, f)
    make_dataset.synthetic(os.path.join(root, "input", "data", "training"), train=train_images, test=100, seed=0)
    return root


def first_step_seconds(image: str, root: str) -> float:
    started = time.monotonic()
    run = subprocess.Popen(
        [
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            "--add-host",
            "algo-1:127.0.0.1",
            "-v",
            f"{root}/input:/opt/ml/input:ro",
            image,
            "train",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seconds = None
    for line in run.stdout:
        if seconds is None and " step 1/" in line:
            seconds = time.monotonic() - started
    if run.wait() != 0 or seconds is None:
        raise SystemExit(f"error: the run in {image} failed or printed no first step (exit code {run.returncode})")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", default="sagemaker-lightning:latest", help="the image to start")
    parser.add_argument("--train-images", type=int, default=5000, help="size of the generated training channel")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best is reported")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        opt_ml(root, args.train_images)
        runs = [first_step_seconds(args.image, root) for _ in range(args.repeat)]
    engine = subprocess.run(
        ["docker", "version", "-f", "{{.Server.Version}}"], capture_output=True, text=True
    ).stdout.strip()
    print(
        f"runs: {', '.join(f'{s:.1f}' for s in runs)} s; {os.cpu_count()} CPUs {platform.processor() or platform.machine()}, "
        f"Docker {engine}, {args.train_images} training images"
    )
    print(f"startup: first_step_s={min(runs):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
