"""Seconds from `docker run` to the first optimizer step, started as SageMaker starts the image, phase by phase, each
ended by the first line of the job's output that marks it (PHASES): the container and PID 1 up with the training
toolkit's `train` imported (with a warm pool's cache, PID 1's install of a requirements.txt too: warmpool.py), the
toolkit's set-up (its install of a requirements.txt), train.py importing torch and Lightning and resolving its
configuration (the runtime's `launch:` line), the trainer, the model and the data set up (the data module's
prepare_data and setup run before the pre-flight line), then the first step. Also the import time of a bare `python
-c pass` in the image (what every Python process there pays before its first line: the start-up hook included).

    python scripts/startup.py --image sagemaker-lightning:latest          # make bench-startup
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

import make_dataset

PHASES = (  # (phase, the output line that ends it), in the order they come
    ("container, PID 1 + toolkit import", r"Imported framework"),  # sagemaker-training's trainer.py
    ("toolkit set-up, requirements", r"Invoking script with the following command"),
    ("script: imports + configuration", r"^launch: "),  # the runtime's launch line
    ("trainer, model + data set-up", r"^pre-flight: "),
    ("first step", r" step 1/"),
)


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


def phase_seconds(image: str, root: str) -> list[float]:
    """Seconds from `docker run` to the end of each of PHASES, in one run."""
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
    ends: list[float] = []
    for line in run.stdout:
        if len(ends) < len(PHASES) and re.search(PHASES[len(ends)][1], line):
            ends.append(time.monotonic() - started)
    if run.wait() != 0 or len(ends) < len(PHASES):
        missing = PHASES[len(ends)][0] if len(ends) < len(PHASES) else "none"
        raise SystemExit(
            f"error: the run in {image} failed (exit code {run.returncode}) or never ended phase {missing}"
        )
    return ends


def bare_python_seconds(image: str, runs: int) -> float:
    """The median of `runs` imports' total of `python -X importtime -c pass` in the image, in seconds: what every
    Python process there imports before its first line (site, the .pth start-up hook and what it imports)."""
    totals = []
    for _ in range(runs):
        done = subprocess.run(
            ["docker", "run", "--rm", "--entrypoint", "python3", image, "-X", "importtime", "-c", "pass"],
            capture_output=True,
            text=True,
            check=True,
        )
        # each line: "import time: self [us] | cumulative | name"; top-level imports have no leading spaces in name
        rows = [line.split("|") for line in done.stderr.splitlines() if line.startswith("import time:")][1:]
        totals.append(sum(int(r[1]) for r in rows if not r[2].startswith("  ")) / 1e6)
    return statistics.median(totals)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", default="sagemaker-lightning:latest", help="the image to start")
    parser.add_argument("--train-images", type=int, default=5000, help="size of the generated training channel")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best is reported")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        opt_ml(root, args.train_images)
        runs = [phase_seconds(args.image, root) for _ in range(args.repeat)]
    bare = bare_python_seconds(args.image, args.repeat)
    engine = subprocess.run(
        ["docker", "version", "-f", "{{.Server.Version}}"], capture_output=True, text=True
    ).stdout.strip()
    best = min(runs, key=lambda ends: ends[-1])
    print(
        f"runs: {', '.join(f'{ends[-1]:.1f}' for ends in runs)} s; {os.cpu_count()} CPUs "
        f"{platform.processor() or platform.machine()}, Docker {engine}, {args.train_images} training images"
    )
    for (phase, _), end, start in zip(PHASES, best, [0.0, *best], strict=False):
        print(f"  {phase:<34} {end - start:5.1f} s (at {end:.1f} s)")
    print(f"python -c pass in the image: {bare:.2f} s of imports (median of {args.repeat})")
    print(f"startup: first_step_s={best[-1]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
