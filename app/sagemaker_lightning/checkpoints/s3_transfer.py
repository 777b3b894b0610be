"""Checkpoints to and from S3 (s3://) at the link's rate: both ways in concurrent parts, boto3's managed transfers
(boto3 comes with the SageMaker training toolkit; its endpoint from the environment, AWS_ENDPOINT_URL as for every
AWS client). A save is serialised while it is sent; a read fetches the object in ranged parts into memory, then
torch.load reads it there.

Measured with scripts/bench_checkpoint.py --only s3 (302 MB; 2 AMD EPYC cores, boto3 1.43.117, moto 5.2.5 on the
same cores; docs/performance.md): a write at 1.05x and 1.23x of a raw upload_file of the serialised file in two runs
(0.81x with torch.save ahead of the upload, Lightning's one stream 0.54-0.68x); torch.save into a pipe 0.20-0.26 s,
run under the upload.

    python -c "from sagemaker_lightning.checkpoints import s3_transfer; print(s3_transfer.download('s3://b/last.ckpt').getbuffer().nbytes)"
"""

import concurrent.futures
import contextlib
import functools
import io
import os

import torch

PART_BYTES = 8 * 2**20  # an S3 transfer's part: boto3's default
PARTS_AT_ONCE = 10  # the parts a transfer sends or fetches at once: boto3's default
MISSING = ("404", "NoSuchKey", "NotFound")  # S3's codes for an object that is not there


def config():
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_chunksize=PART_BYTES, max_concurrency=PARTS_AT_ONCE)


def located(url: str) -> tuple[str, str]:
    """(bucket, key) of s3://bucket/key."""
    bucket, key = url[len("s3://") :].split("/", 1)
    return bucket, key


def upload(snapshot: dict, url: str, beside=None) -> None:
    """The snapshot as the object at `url`, serialised while it is sent: torch.save writes into a pipe in a second
    thread (it needs only write and flush of its file), boto3's managed multipart upload reads the other end and sends
    parts concurrently. The object appears when the upload completes; a torch.save that fails raises in the reader,
    and boto3 aborts the upload. `beside()` (last.ckpt's previous object kept: writer.persist) runs in a third thread
    while the parts go, and the upload completes only once it is done (`held`): it sees the object as it was before,
    and adds to the write's time only what outlasts the upload; its failure aborts the upload."""
    read_end, write_end = os.pipe()
    threads = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="checkpoint-upload")
    # left in this order: the read end closed (a torch.save blocked on a failed upload's full pipe then fails with
    # BrokenPipeError), the threads joined, the write end closed (done already unless torch.save never ran)
    with open(write_end, "wb") as sink, threads, open(read_end, "rb") as f:
        serialised = threads.submit(serialise, snapshot, sink)
        with held(url, threads.submit(beside or (lambda: None))):
            s3_client().upload_fileobj(Serialised(f, serialised), *located(url), Config=config())


@contextlib.contextmanager
def held(url: str, before: concurrent.futures.Future):
    """Inside, the request that makes the object at `url` appear (a multipart upload's completion, a small object's
    one PutObject) is sent only once `before` is done; its failure is raised there instead (boto3 then aborts the
    upload). A hook on the process's client, for this key only: botocore's before-parameter-build event, whose params
    are the call's (before-call's are the request's)."""
    bucket, key = located(url)

    def wait(params, **kwargs):
        if params.get("Bucket") == bucket and params.get("Key") == key:
            before.result()

    events = s3_client().meta.events
    names = [f"before-parameter-build.s3.{operation}" for operation in ("CompleteMultipartUpload", "PutObject")]
    for name in names:
        events.register(name, wait)
    try:
        yield
    finally:
        for name in names:
            events.unregister(name, wait)


def serialise(snapshot: dict, sink) -> None:
    with sink:  # closed at the end: the reader's end of file
        torch.save(snapshot, sink)


class Serialised:
    """torch.save's pipe, read part by part (not seekable); its end raises torch.save's error, if any, so that boto3
    aborts the upload instead of completing an object cut short."""

    def __init__(self, f, serialised: concurrent.futures.Future):
        self.f, self.serialised = f, serialised

    def read(self, size: int = -1) -> bytes:
        data = self.f.read(size)
        if size < 0 or len(data) < size:  # the end (a pipe's buffered read is short only there)
            self.serialised.result()
        return data


def copy(source: str, target: str) -> None:
    """The object at s3:// `source` also at `target`, copied by S3 itself: one CopyObject up to 5 GB (S3's limit for
    it), a managed multipart copy beyond. Measured on moto 5.2.5 (302 MB, 2 AMD EPYC cores, nothing else running):
    1.45 s, 0.83 s in keep_previous, against 3.2-3.7 s through s3fs's copy (a CopyObject too, the difference not
    traced)."""
    from boto3.s3.transfer import TransferConfig

    bucket, key = located(source)
    whole = TransferConfig(multipart_threshold=5 * 2**30, multipart_chunksize=PART_BYTES, max_concurrency=PARTS_AT_ONCE)
    s3_client().copy({"Bucket": bucket, "Key": key}, *located(target), Config=whole)


def download(url: str) -> io.BytesIO:
    """The object at `url` in memory, fetched in concurrent ranged parts. A missing object raises FileNotFoundError,
    any other failure OSError (as s3fs raises them: io.retried tries a transient one again)."""
    from botocore.exceptions import BotoCoreError, ClientError

    data = io.BytesIO()
    try:
        s3_client().download_fileobj(*located(url), data, Config=config())
    except ClientError as e:
        error = e.response.get("Error", {})
        if error.get("Code") in MISSING:
            raise FileNotFoundError(url) from e
        raise OSError(f"{error.get('Code')}: {error.get('Message') or e}") from e
    except BotoCoreError as e:  # a dropped connection, a timeout, no credentials
        raise OSError(str(e)) from e
    data.seek(0)
    return data


@functools.cache
def s3_client():
    """One S3 client for the process's transfers (made once: tens of ms), boto3's defaults: each part sent with its
    CRC32, which over HTTPS also spares signing the payload (botocore's S3SigV4Auth)."""
    import boto3

    return boto3.client("s3")
