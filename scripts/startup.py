"""Seconds from `docker run` to the first optimizer step, started as SageMaker starts the image, phase by phase, each
ended by the first line of the job's output that marks it (PHASES): the container and PID 1 up with the training
toolkit's `train` imported (with a warm pool's cache, PID 1's install of a requirements.txt too: warmpool.py), the
toolkit's set-up (its install of a requirements.txt), train.py importing torch and Lightning and resolving its
configuration (the runtime's `launch:` line), the trainer, the model and the data set up (the data module's
prepare_data and setup run before the pre-flight line), then the first step. Also the import time of a bare `python
-c pass` in the image (what every Python process there pays before its first line: the start-up hook included).

    python scripts/startup.py --image sagemaker-lightning:latest          # make bench-startup
    python scripts/startup.py --image sagemaker-lightning:before --against sagemaker-lightning:latest --repeat 8

--against: a second image started alternately with the first, which starts first swapped each round, so that the
machine's drift in speed (±30 % within minutes on shared cores) falls on both alike: each phase's median in both, and
the median of the pairs' differences.
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


def durations(ends: list[float]) -> list[float]:
    """Each phase's seconds, from the ends of PHASES in one run."""
    return [end - start for end, start in zip(ends, [0.0, *ends], strict=False)]


def compare(images: list[str], root: str, rounds: int) -> None:
    """Print each phase's median in both images and the median of the rounds' differences (second minus first)."""
    runs: dict[str, list[list[float]]] = {image: [] for image in images}
    for r in range(rounds):
        for image in images if r % 2 == 0 else images[::-1]:
            runs[image].append(durations(phase_seconds(image, root)))
    first, second = (runs[image] for image in images)
    for image in images:
        print(f"{image}: runs {', '.join(f'{sum(d):.1f}' for d in runs[image])} s")
    print(f"  {'phase':<34} {'first':>7} {'second':>7} {'second - first, median of pairs':>34}")
    for i, (phase, _) in enumerate([*PHASES, ("docker run -> first step", "")]):
        a, b = ([sum(d) if i == len(PHASES) else d[i] for d in side] for side in (first, second))
        median_pair = statistics.median(y - x for x, y in zip(a, b, strict=True))
        print(f"  {phase:<34} {statistics.median(a):6.2f}s {statistics.median(b):6.2f}s {median_pair:+33.2f}s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", default="sagemaker-lightning:latest", help="the image to start")
    parser.add_argument("--train-images", type=int, default=5000, help="size of the generated training channel")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs (of each image with --against); the best is reported"
    )
    parser.add_argument("--against", help="a second image, started alternately with --image (module docstring)")
    args = parser.parse_args()
    engine = subprocess.run(
        ["docker", "version", "-f", "{{.Server.Version}}"], capture_output=True, text=True
    ).stdout.strip()
    machine = f"{os.cpu_count()} CPUs {platform.processor() or platform.machine()}, Docker {engine}"
    with tempfile.TemporaryDirectory() as root:
        opt_ml(root, args.train_images)
        if args.against:
            print(f"{args.repeat} rounds; {machine}, {args.train_images} training images")
            compare([args.image, args.against], root, args.repeat)
            return 0
        runs = [phase_seconds(args.image, root) for _ in range(args.repeat)]
    bare = bare_python_seconds(args.image, args.repeat)
    best = min(runs, key=lambda ends: ends[-1])
    print(f"runs: {', '.join(f'{ends[-1]:.1f}' for ends in runs)} s; {machine}, {args.train_images} training images")
    for (phase, _), seconds, end in zip(PHASES, durations(best), best, strict=True):
        print(f"  {phase:<34} {seconds:5.1f} s (at {end:.1f} s)")
    print(f"python -c pass in the image: {bare:.2f} s of imports (median of {args.repeat})")
    print(f"startup: first_step_s={best[-1]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
