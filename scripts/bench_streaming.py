"""File against streaming on the same data, on this machine: time to the first step, steady images/s with the
example's model and with a near-no-op model (the loader's ceiling), and the peak of the data on local disk.

  File       the channel copied whole before anything else, as SageMaker's File mode does before the job starts
             (the archive downloaded from S3), then the example's DataLoader pipeline (CIFAR10DataModule, reading the
             archive in place)
  streaming  the example's StreamingCIFAR10DataModule on the s3:// prefix scripts/upload_data.py --format litdata
             writes: chunks downloaded into the cache as the batches need them

S3 is a moto server started here, on this machine: what only AWS can show (S3's throughput to an instance, FastFile's
mount, a volume's speed) is not measured (docs/streaming.md). Each mode and model runs in a process of its own; the
last line is machine-readable.

    python scripts/bench_streaming.py                                   # 20,000 images, CPU: a few minutes
    python scripts/bench_streaming.py --images 50000 --model resnet18 --steps 50 --batch-size 128 --workers 4
"""

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import machine
import make_dataset
import optimize_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "bench"
NOOP = "noop"  # the near-no-op model: a linear layer on each image's channel means (the loader's ceiling)


def folder_bytes(path: str) -> int:
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:  # removed meanwhile (a chunk evicted from the cache)
                pass
    return total


class PeakDisk(threading.Thread):
    """The largest size `path` reached, sampled every 20 ms."""

    def __init__(self, path: str):
        super().__init__(daemon=True)
        self.path, self.peak, self.done = path, 0, threading.Event()

    def run(self):
        while not self.done.wait(0.02):
            self.peak = max(self.peak, folder_bytes(self.path))

    def stop(self) -> int:
        self.done.set()
        self.join()
        return max(self.peak, folder_bytes(self.path))


def network(name: str):
    import torch

    from model import build_network

    if name == NOOP:
        return torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(3, 10))
    return build_network(name, 10, cifar_stem=True)


def measure(args) -> dict:
    """In this process: one mode and one model; what the module docstring says."""
    import boto3
    import torch
    from torch.nn import functional as F

    from data import CIFAR10DataModule
    from streaming_data import StreamingCIFAR10DataModule

    torch.set_num_threads(max(1, (os.cpu_count() or 2) - args.workers))
    local = tempfile.mkdtemp(prefix=f"bench-{args.run}-")
    os.environ["LITDATA_CACHE_DIR"] = os.path.join(local, "cache")  # before litdata's import: its default cache
    os.environ["MAX_CACHE_SIZE"] = args.max_cache_size  # litdata's bound on it, as a job's --env sets it
    disk = PeakDisk(local)
    disk.start()
    start = time.perf_counter()
    common = dict(batch_size=args.batch_size, num_workers=args.workers, val_split=0)
    if args.run == "file":
        channel = os.path.join(local, "channel")
        os.makedirs(channel)
        boto3.client("s3").download_file(BUCKET, f"files/{make_dataset.ARCHIVE}", f"{channel}/{make_dataset.ARCHIVE}")
        data = CIFAR10DataModule(channel, **common)
    else:
        data = StreamingCIFAR10DataModule(f"s3://{BUCKET}/litdata/", **common)
    data.setup("fit")
    net = network(args.model)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    batches = iter(data.train_dataloader())
    first = timed = None
    for step in range(args.warmup + args.steps + 1):
        x, y = next(batches)
        loss = F.cross_entropy(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 0:
            first = time.perf_counter() - start
        if step == args.warmup:
            timed = time.perf_counter()
    images_per_s = args.steps * args.batch_size / (time.perf_counter() - timed)
    peak = disk.stop()
    shutil.rmtree(local, ignore_errors=True)
    return {"first_step_s": first, "images_per_s": images_per_s, "peak_disk_mb": peak / 1e6}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare(args, env: dict) -> dict:
    """Generated CIFAR-10-format data on the moto server: the archive (File) and its optimized chunks (streaming)."""
    import boto3

    work = tempfile.mkdtemp(prefix="bench-data-")
    try:
        archive = make_dataset.synthetic(work, train=args.images, test=max(100, args.images // 10), seed=0)
        files = optimize_data.optimize(work, os.path.join(work, "litdata"), args.chunk_bytes)
        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
        s3.create_bucket(Bucket=BUCKET)
        s3.upload_file(archive, BUCKET, f"files/{make_dataset.ARCHIVE}")
        for name, path in files.items():
            s3.upload_file(path, BUCKET, f"litdata/{name}")
        chunks = [p for n, p in files.items() if n.startswith("train/chunk-")]
        return {"archive_mb": os.path.getsize(archive) / 1e6, "chunks": len(chunks),
                "chunk_mb": max(os.path.getsize(p) for p in chunks) / 1e6}  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


def versions() -> str:
    from importlib.metadata import version

    return ", ".join(f"{p} {version(p)}" for p in ("torch", "litdata", "lightning", "moto"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=20000, help="training images generated")
    parser.add_argument("--chunk-bytes", default="4MB", help="litdata's chunk size (upload_data.py --chunk-bytes)")
    parser.add_argument("--max-cache-size", default="16MB", help="streaming: litdata's cache bound (MAX_CACHE_SIZE)")
    parser.add_argument("--model", default="resnet18", help="the example's model (model.arch) besides the no-op one")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers, both modes")
    parser.add_argument("--warmup", type=int, default=3, help="steps before the timed ones")
    parser.add_argument("--steps", type=int, default=15, help="timed steps with the model (the no-op: 10 times more)")
    parser.add_argument("--run", choices=["file", "streaming"], help=argparse.SUPPRESS)  # one measurement
    args = parser.parse_args()
    if args.run:
        print(json.dumps(measure(args)))
        return 0
    port = free_port()
    env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "bench",
           "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
           "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "app", "example"), os.path.join(ROOT, "app")])}  # fmt: skip
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{env['AWS_ENDPOINT_URL']}/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        os.environ.update({k: env[k] for k in env if k.startswith("AWS_")})
        data = prepare(args, env)
        results = {}
        for model, steps in ((args.model, args.steps), (NOOP, 10 * args.steps)):
            for mode in ("file", "streaming"):
                words = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if v is not None]
                run = subprocess.run(
                    [sys.executable, __file__, *words, f"--run={mode}", f"--model={model}", f"--steps={steps}"],
                    env=env, capture_output=True, text=True, timeout=1800,
                )  # fmt: skip
                if run.returncode:
                    raise SystemExit(f"error: {mode} with {model} failed:\n{run.stderr[-3000:]}")
                results[mode, model] = json.loads(run.stdout.strip().splitlines()[-1])
    finally:
        server.terminate()
        server.wait()
    print(f"machine: {machine.cpu()}, {os.cpu_count()} CPUs, {platform.python_version()}; {versions()}")
    print(f"data: {args.images} generated CIFAR-10 images, archive {data['archive_mb']:.1f} MB; litdata "
          f"{data['chunks']} chunks of at most {data['chunk_mb']:.1f} MB; S3: moto on this machine")  # fmt: skip
    print(f"batch {args.batch_size}, {args.workers} DataLoader worker(s), {args.warmup} warm-up steps, streaming "
          f"cache bound {args.max_cache_size}")  # fmt: skip
    print(f"{'mode':<10} {'model':<18} {'first step s':>12} {'images/s':>10} {'peak disk MB':>13}")
    for (mode, model), r in results.items():
        print(
            f"{mode:<10} {model:<18} {r['first_step_s']:>12.2f} {r['images_per_s']:>10.0f} {r['peak_disk_mb']:>13.1f}"
        )
    summary = " ".join(f"{mode}_{'noop' if model == NOOP else 'model'}={r['images_per_s']:.0f}" for (mode, model), r in results.items())  # fmt: skip
    print(f"bench_streaming: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
