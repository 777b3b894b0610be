"""Training throughput on this machine: Krasser's part-1 pipeline, the project's default, and the model alone.

Each path trains ResNet-18 (CIFAR stem, app/example/trainer.yaml's model) in a fresh process (scripts/throughput.py), so
each has its own start-up time and peak memory:
  baseline    the pipeline of Martin Krasser's "Using AWS SageMaker with minimal dependencies, part 1"
              (https://krasserm.github.io/2022/01/21/sagemaker-multi-node/): CIFAR10DataModule (PIL transforms in
              1 DataLoader worker), fp32, batch 32, Adam
  default     app/example/trainer.yaml as it is, plus the train.py arguments after --
  model_only  the default's model, trainer, precision and batch size on one synthetic batch already on the device
on generated CIFAR-10-format data (scripts/make_dataset.py), one device. The last line is machine-readable:
  bench: baseline=<img/s> default=<img/s> model_only=<img/s> default/baseline=<x> default/model_only=<y>

    python scripts/benchmark.py                                      # CPU: one to two minutes on 2 cores
    python scripts/benchmark.py --train-images 50000 --warmup 30 --steps 300 --repeat 3   # a GPU
    python scripts/benchmark.py -- --model.compile true              # a switch, for default and model_only
"""

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time

import make_dataset

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The Estimator hyperparameters of Krasser's part 1 (tests/unit/cli/test_cli.py: KRASSER_PART1), less the CPU-only
# accelerator, plus its 1 worker and fp32
BASELINE = ["--data", "CIFAR10DataModule", "--data.batch_size", "32", "--data.num_workers", "1", "--optimizer", "Adam"]
BASELINE += [
    "--optimizer.lr",
    "1e-3",
    "--trainer.precision",
    "32-true",
    "--model.channels_last",
    "false",
    "--model.compile",
    "false",
]
PATHS = ("baseline", "default", "model_only")


def bench_data(root: str, train_images: int) -> str:
    """Generated images in the CIFAR-10 format, made once per size and unpacked, so no measured run unpacks them."""
    out = os.path.join(root, str(train_images))
    if not os.path.isdir(os.path.join(out, make_dataset.FOLDER)):
        print(f"generating {train_images} images in {out} ...", flush=True)
        make_dataset.synthetic(out, train=train_images, test=100, seed=0)
        with tarfile.open(os.path.join(out, make_dataset.ARCHIVE)) as tar:
            tar.extractall(out, filter="data")
    return out


def run(path: str, train_args: list[str], warmup: int, steps: int, log_dir: str) -> dict:
    """One path in a fresh process; its measurements, or the end of its output when it fails."""
    command = [sys.executable, os.path.join(HERE, "throughput.py"), "--warmup", str(warmup), "--steps", str(steps)]
    command += ["--model-only"] * (path == "model_only") + ["--started", repr(time.time()), "--"] + train_args
    command += ["--logger.save_dir", log_dir]
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("throughput: ")]
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stdout.splitlines()[-20:])
        raise SystemExit(f"error: the {path} run failed (exit {done.returncode}):\n{tail}")
    return json.loads(lines[-1].removeprefix("throughput: "))


def mib(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def report(results: dict[str, list[dict]], args: argparse.Namespace, data_dir: str) -> None:
    best = {path: max(runs, key=lambda r: r["images_per_s"]) for path, runs in results.items()}
    hw = best["default"]["hardware"]
    print(f"date: {time.strftime('%Y-%m-%d')}")
    limits = " ".join(f"{k}={v}" for k, v in hw["isa_limits"].items())
    print(
        f"hardware: {hw['gpu'] or 'no GPU'}; CPU {hw['cpu']}, {hw['cores']} cores, {hw['torch_threads']} torch threads, "
        f"torch CPU capability {hw['cpu_capability']}{', held by ' + limits if limits else ''}, "
        f"bf16 units: {hw['cpu_bf16'] or 'none'}"
    )
    print(
        f"versions: python {hw['python']}, torch {hw['torch']}, torchvision {hw['torchvision']}, "
        f"pytorch-lightning {hw['lightning']}, CUDA {hw['cuda'] or '-'}"
    )
    print(
        f"data: {data_dir} ({args.train_images} generated images, 90% for training); device {best['default']['device']}"
    )
    print(f"{best['default']['precision_line']} (default and model_only)")
    print(
        f"images/s over {args.steps} steps after {args.warmup} warm-up steps, best of {args.repeat} fresh process(es) per path;"
    )
    print("first step: seconds from process start to the end of the first optimizer step (the fastest run);")
    print("peak memory: of the training process (not its DataLoader workers), the largest of the runs\n")
    print(
        f"{'path':<11} {'data':<26} {'batch':>5} {'precision':<10} {'ch.last':<7} {'compile':<7} "
        f"{'img/s':>8} {'first step s':>12} {'host MiB':>9} {'device MiB':>10}"
    )
    for path in PATHS:
        r = best[path]
        first = min(run["first_step_s"] for run in results[path])
        host = max(run["peak_host_mib"] for run in results[path])
        device = None if r["peak_device_mib"] is None else max(run["peak_device_mib"] for run in results[path])
        print(
            f"{path:<11} {r['data']:<26} {r['batch_size']:>5} {r['precision']:<10} {str(r['channels_last']):<7} "
            f"{str(r['compile']):<7} {r['images_per_s']:>8.1f} {first:>12.1f} {mib(host):>9} {mib(device):>10}"
        )
    baseline, default, model_only = (best[p]["images_per_s"] for p in PATHS)
    print(f"\ndefault/baseline = {default / baseline:.2f}x, default/model_only = {default / model_only:.2f}x")
    print(
        f"bench: baseline={baseline:.1f} default={default:.1f} model_only={model_only:.1f} "
        f"default/baseline={default / baseline:.2f} default/model_only={default / model_only:.2f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--train-images", type=int, default=50000, help="images generated for the data set (90%% train)"
    )
    parser.add_argument(
        "--data-root", default=os.path.join(ROOT, "data", "bench"), help="where generated data sets are kept"
    )
    parser.add_argument(
        "--warmup", type=int, default=3, help="steps before the clock starts (compilation happens there)"
    )
    parser.add_argument("--steps", type=int, default=20, help="steps timed per path")
    parser.add_argument(
        "--batch-size", type=int, default=None, help="default and model_only batch size; none: trainer.yaml's"
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="fresh processes per path, interleaved; the fastest counts"
    )
    parser.add_argument(
        "train_args", nargs="*", help="app/example/train.py arguments for default and model_only, after --"
    )
    args = parser.parse_args()
    if args.warmup < 1 or args.steps < 1 or args.repeat < 1 or args.train_images < 100:
        parser.error("--warmup, --steps and --repeat must be at least 1, --train-images at least 100")
    data_dir = bench_data(args.data_root, args.train_images)
    common = ["--data.data_dir", data_dir, "--trainer.devices", "1"]
    default = common + (["--data.batch_size", str(args.batch_size)] if args.batch_size else []) + args.train_args
    train_args = {"baseline": common + BASELINE, "default": default, "model_only": default}
    results: dict[str, list[dict]] = {path: [] for path in PATHS}
    with tempfile.TemporaryDirectory() as log_dir:  # the runs' TensorBoard logs are of no further use
        for i in range(args.repeat):
            for path in PATHS:  # interleaved: a slow spell on a shared machine hits every path alike
                r = run(path, train_args[path], args.warmup, args.steps, log_dir)
                results[path].append(r)
                print(
                    f"run {i + 1}/{args.repeat} {path}: {r['images_per_s']:.1f} images/s, first step after {r['first_step_s']:.1f} s",
                    flush=True,
                )
    report(results, args, data_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
