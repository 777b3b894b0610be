"""Whole-file checkpoints to and from S3, each way against boto3's own transfer of the same bytes with its default
TransferConfig (8 MiB parts, 10 at a time): the raw rate of this link. S3 is a moto server started on this machine,
or a real bucket (--s3-url, with the machine's AWS credentials: the only place S3's and an instance's rates show).

A write is timed from the state in memory to the complete object (serialising included), a read from the object to
the state in memory (deserialising included); the raw transfers move the serialised file between the local disk and
S3.

    python scripts/bench_checkpoint.py --only s3
    python scripts/bench_checkpoint.py --only s3 copies --s3-url s3://my-bucket/bench/   # on AWS
"""

import contextlib
import dataclasses
import io
import os
import socket
import subprocess
import sys
import time
import urllib.request

import torch

from sagemaker_lightning.checkpoints import writer
from sagemaker_lightning.checkpoints.io import read

RUNTIME = "the runtime's (checkpoints/s3_transfer.py)"  # the way the runtime writes and reads, by its label

MOTO_BUCKET = "bench-checkpoint"
PART = 8 * 2**20  # the parts of the tuned s3fs and s3torchconnector ways: boto3's default, so 10 parts run at once
REGION = "us-east-1"  # moto's


@dataclasses.dataclass(frozen=True)
class Where:
    """Where the objects go: a bucket, a key prefix ('' or ending in '/'), an endpoint (None: AWS's)."""

    bucket: str
    prefix: str
    endpoint: str | None

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def url(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.key(name)}"


def parse(url: str) -> Where:
    """s3://bucket[/prefix] as a Where on AWS; one error line for anything else."""
    if not url.startswith("s3://") or not url[5:].split("/", 1)[0]:
        raise SystemExit(
            f"error: --s3-url {url} is not s3://bucket/prefix: give a bucket the AWS credentials can write"
        )
    bucket, _, prefix = url[5:].partition("/")
    return Where(bucket, prefix.strip("/") + "/" if prefix.strip("/") else "", None)


@contextlib.contextmanager
def moto_server():
    """A moto server on a free port, its endpoint in AWS_ENDPOINT_URL (boto3 and s3fs find it there) with made-up
    keys, and an empty bucket; yields its Where."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit(f"error: the moto server on port {port} did not answer in 60 s")
        os.environ.update(
            AWS_ENDPOINT_URL=endpoint,
            AWS_ACCESS_KEY_ID="bench",
            AWS_SECRET_ACCESS_KEY="bench",
            AWS_DEFAULT_REGION=REGION,
        )
        client().create_bucket(Bucket=MOTO_BUCKET)
        yield Where(MOTO_BUCKET, "", endpoint)
    finally:
        server.terminate()
        server.wait()


@contextlib.contextmanager
def bucket(url: str):
    """A real bucket's prefix; the objects written there removed at the end."""
    where = parse(url)
    try:
        yield where
    finally:
        s3 = client()
        for name in NAMES:
            s3.delete_object(Bucket=where.bucket, Key=where.key(name))


# every object the ways write
NAMES = ("last.ckpt", "last-previous.ckpt", "raw.ckpt", "fileobj.ckpt", "runtime.ckpt", "epoch=0-step=5.ckpt")


def client():
    import boto3

    return boto3.client("s3")


def filesystem():
    """s3fs, a fresh instance (not fsspec's cached one, whose settings an earlier way may have changed)."""
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True)


def connector(where: Where):
    """s3torchconnector's S3Checkpoint (moto: its endpoint, path-style, as moto's http endpoint has no bucket hosts),
    or None where it is not installed."""
    try:
        from s3torchconnector import S3Checkpoint, S3ClientConfig
    except ImportError:
        return None
    region = client().meta.region_name
    config = S3ClientConfig(part_size=PART, force_path_style=where.endpoint is not None)
    return S3Checkpoint(region, endpoint=where.endpoint, s3client_config=config)


def serialised(tree) -> bytes:
    buffer = io.BytesIO()
    torch.save(tree, buffer)
    return buffer.getvalue()


def load(data) -> dict:
    """A checkpoint from bytes or a readable stream, weights only (as the runtime reads one)."""
    return torch.load(io.BytesIO(data) if isinstance(data, bytes) else data, map_location="cpu", weights_only=True)


def writes(tree, local: str, where: Where) -> dict:
    """Each way of writing `tree` to S3, as a function of no arguments; `local` holds its serialised bytes (the raw
    upload's file)."""
    from lightning.fabric.plugins.io import TorchCheckpointIO

    fs, s3, url = filesystem(), client(), where.url("last.ckpt")

    def stream():
        with fs.open(url, "wb") as f:
            torch.save(tree, f)

    ways = {
        "raw: boto3 upload_file (the file)": lambda: s3.upload_file(local, where.bucket, where.key("raw.ckpt")),
        "Lightning 2.6.6 TorchCheckpointIO (pipe)": lambda: TorchCheckpointIO().save_checkpoint(tree, url),
        "s3fs open('wb') + torch.save stream": stream,
        "s3fs pipe, 8 MiB parts x10": lambda: fs.pipe(url, serialised(tree), chunksize=PART),
        "s3fs put_file, 8 MiB parts x10 (the file)": lambda: fs.put_file(local, url, chunksize=PART),
        RUNTIME: lambda: writer.persist(tree, where.url("runtime.ckpt")),
        "boto3 upload_fileobj (BytesIO)": lambda: s3.upload_fileobj(
            io.BytesIO(serialised(tree)), where.bucket, where.key("fileobj.ckpt")
        ),
    }
    if checkpoint := connector(where):

        def connector_write():
            with checkpoint.writer(url) as w:
                torch.save(tree, w)

        ways["s3torchconnector S3Checkpoint writer"] = connector_write
    return ways


def reads(local: str, where: Where) -> dict:
    """Each way of reading the checkpoint back into memory (the resume), after one write of it (`local`'s bytes)."""
    from lightning.fabric.plugins.io import TorchCheckpointIO

    fs, s3, url, key = filesystem(), client(), where.url("last.ckpt"), where.key("last.ckpt")
    s3.upload_file(local, where.bucket, key)
    target = f"{local}.downloaded"

    def stream():
        return load(s3.get_object(Bucket=where.bucket, Key=key)["Body"].read())

    def download():
        buffer = io.BytesIO()
        s3.download_fileobj(where.bucket, key, buffer)
        return load(buffer.getvalue())

    def get_file():
        fs.get_file(url, target, chunksize=PART)
        return torch.load(target, map_location="cpu", weights_only=True, mmap=True)

    ways = {
        "raw: boto3 download_file (to a file)": lambda: s3.download_file(where.bucket, key, target),
        "Lightning 2.6.6 TorchCheckpointIO (open rb)": lambda: TorchCheckpointIO().load_checkpoint(
            url, weights_only=True
        ),
        RUNTIME: lambda: read(url),
        "s3fs cat_file, 8 MiB ranges x10": lambda: load(fs.cat_file(url, chunksize=PART)),
        "s3fs get_file, 8 MiB ranges x10 + mmap load": get_file,
        "boto3 download_fileobj (BytesIO)": download,
        "boto3 get_object, one stream (no ranges)": stream,
    }
    if checkpoint := connector(where):

        def connector_read():
            with checkpoint.reader(url) as r:
                return load(r)

        ways["s3torchconnector S3Checkpoint reader"] = connector_read
    return ways


def timings(ways: dict, repeat: int) -> dict[str, list[float]]:
    """Seconds of each way, `repeat` times; no warm-up (a transfer takes seconds: the median leaves out a first run's
    connections and imports)."""
    times = {}
    for name, way in ways.items():
        times[name] = []
        for _ in range(repeat):
            start = time.perf_counter()
            way()
            times[name].append(time.perf_counter() - start)
    return times


def ranged_get_s(where: Where) -> float:
    """Seconds of one 1 KiB ranged GET of the checkpoint (reads' object), the fastest of 3: moto reads the whole
    object for each ranged request, so a reader of N ranges pays N times this there, and not on S3."""
    s3, best = client(), float("inf")
    for _ in range(3):
        start = time.perf_counter()
        s3.get_object(Bucket=where.bucket, Key=where.key("last.ckpt"), Range="bytes=0-1023")["Body"].read()
        best = min(best, time.perf_counter() - start)
    return best


def second_copy(data: bytes, where: Where, repeat: int) -> dict[str, list[float]]:
    """The same object under a second key: uploaded again (s3fs pipe, 8 MiB parts) or copied by S3 itself
    (CopyObject: no bytes through this machine; one request up to 5 GB, a multipart copy beyond)."""
    fs, s3 = filesystem(), client()
    source, target = where.key("epoch=0-step=5.ckpt"), where.key("last.ckpt")
    fs.pipe(f"{where.bucket}/{source}", data, chunksize=PART)
    times = {"S3: upload it again": [], "S3: server-side copy_object": []}
    for _ in range(repeat):
        start = time.perf_counter()
        fs.pipe(f"{where.bucket}/{target}", data, chunksize=PART)
        times["S3: upload it again"].append(time.perf_counter() - start)
        start = time.perf_counter()
        s3.copy_object(Bucket=where.bucket, Key=target, CopySource={"Bucket": where.bucket, "Key": source})
        times["S3: server-side copy_object"].append(time.perf_counter() - start)
    return times
