"""Seconds the example's LightningCLI takes from its construction to the start of fit: the parser built, the job's
command line parsed, the classes and the trainer made. That is the runtime's own share of start-up, which
`make bench-startup` cannot resolve: its phase "script: imports + configuration" holds the imports too, and that
phase's spread between runs is larger than the whole of this one. Run as a one-host SageMaker job (the SM_*
variables, a training channel of generated images), each run in a fresh process, with the imports done before the
clock starts. `--against REF` times another commit's tree too (a git worktree), the two alternating, and prints the
median of the pairs' differences.

    python scripts/bench_configuration.py --repeat 6                     # this tree
    python scripts/bench_configuration.py --against def3ec1 --repeat 6   # and def3ec1's, alternately
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile

import machine
import make_dataset

HERE = os.path.dirname(os.path.abspath(__file__))
ARGS = ["--trainer.max_steps", "1", "--trainer.limit_val_batches", "0", "--trainer.accelerator", "cpu"]
CHILD = """
import time, train, sagemaker_lightning, lightning.pytorch.cli as a, pytorch_lightning.cli as b
assert sagemaker_lightning.__file__.startswith(%r), sagemaker_lightning.__file__  # the tree's, not the installed one
a.LightningCLI._run_subcommand = b.LightningCLI._run_subcommand = lambda self, subcommand: None  # configure only
started = time.perf_counter()
train.main(%r)
print(time.perf_counter() - started)
"""


def seconds(tree: str, data: str, work: str) -> float:
    """One run's seconds in a fresh process, with `tree`'s runtime and example."""
    out = os.path.join(work, "opt_ml")
    shutil.rmtree(out, ignore_errors=True)  # the last run's job folder
    env = {
        **os.environ,
        "PYTHONPATH": f"{tree}/app:{tree}/app/example",
        "SAGEMAKER_BASE_DIR": out,
        "SM_HOSTS": '["localhost"]',
        "SM_CURRENT_HOST": "localhost",
        "SM_NUM_GPUS": "0",
        "SM_OUTPUT_DIR": f"{out}/output",
        "SM_MODEL_DIR": f"{out}/model",
        "SM_CHANNELS": json.dumps(["training"]),
        "SM_CHANNEL_TRAINING": data,
    }
    done = subprocess.run(
        [sys.executable, "-c", CHILD % (tree, ARGS)],
        cwd=f"{tree}/app/example",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode:
        raise SystemExit(f"error: the run with {tree} failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=6, help="runs of each tree")
    parser.add_argument("--against", help="a git commit whose tree is timed too, alternately")
    args = parser.parse_args()
    import jsonargparse
    import lightning
    import torch

    print(
        f"{machine.cpu()}, {os.cpu_count()} cores; Python {platform.python_version()}, torch {torch.__version__}, "
        f"lightning {lightning.__version__}, jsonargparse {jsonargparse.__version__}; {args.repeat} runs each"
    )
    here = os.path.dirname(HERE)
    with tempfile.TemporaryDirectory() as work:
        data = os.path.join(work, "training")
        make_dataset.synthetic(data, train=100, test=10, seed=0)
        trees = {"this tree": here}
        if args.against:
            trees[args.against] = os.path.join(work, "against")
            worktree = ["git", "-C", here, "worktree", "add", "-q", "--detach", trees[args.against], args.against]
            subprocess.run(worktree, check=True)
        try:
            runs = {name: [] for name in trees}
            for r in range(args.repeat):
                for name in list(trees)[:: 1 if r % 2 == 0 else -1]:
                    runs[name].append(seconds(trees[name], data, work))
        finally:
            if args.against:
                subprocess.run(["git", "-C", here, "worktree", "remove", "--force", trees[args.against]], check=True)
    for name, times in runs.items():
        print(f"  {name:<12} median {statistics.median(times):.3f} s  (runs {', '.join(f'{t:.2f}' for t in times)})")
    if args.against:
        pairs = [mine - theirs for mine, theirs in zip(*runs.values(), strict=True)]
        print(f"  this tree - {args.against}: {statistics.median(pairs):+.3f} s, the median of {len(pairs)} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
