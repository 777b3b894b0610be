"""Put a training channel's data under an S3 prefix and print the URI to pass as --input of scripts/run_sagemaker.py.

--from DIR uploads a directory of yours: every file under it, at the same relative names (your own project's data,
which its data module reads from the channel's directory), except for CIFAR-10 in a layout the example reads
(app/example/data.py): then only cifar-10-python.tar.gz when DIR has it (one object, unpacked on each node), else
cifar-10-batches-py/. Without --from it downloads the official CIFAR-10 into data/cifar10 (checked against its md5
sums; reused when already there, as by `make local`). The prefix must be empty: a job's channel receives every object
under it, stale ones included.

--format litdata uploads litdata's optimized format instead (scripts/optimize_data.py: CIFAR-10, or a folder of
images): train/ and test/, each chunk files and index.json, what a job streams from S3 instead of copying it whole
(app/example/streaming_data.py: --data=StreamingCIFAR10DataModule --data.data_dir s3://...).

    python scripts/upload_data.py s3://my-bucket/points --from data/points          # any folder of yours
    python scripts/upload_data.py s3://my-bucket/cifar10                            # downloads CIFAR-10 first
    python scripts/upload_data.py s3://my-bucket/cifar10-litdata --format litdata   # streamed, not copied
"""

import argparse
import contextlib
import os
import re
import sys
import tempfile

import boto3
from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import BotoCoreError, ClientError

import aws_account
import make_dataset
import optimize_data

DOWNLOADS = os.path.join("data", "cifar10")


def s3_prefix(uri: str) -> tuple[str, str]:
    """'s3://bucket/a/b/' → ('bucket', 'a/b'); one line when it names no prefix (a whole bucket is no channel)."""
    match = re.fullmatch(r"s3://([^/]+)/+(.*[^/])/*", uri)
    if not match:
        raise SystemExit(f"error: {uri!r} is not s3://bucket/prefix; e.g. s3://my-bucket/cifar10")
    return match.group(1), match.group(2)


def dataset_files(source: str) -> dict[str, str]:
    """{name under the prefix: local path} of what the trainer reads in `source`: CIFAR-10's files when it holds one of
    the example's layouts, else every file; one line when it holds none."""
    if not os.path.isdir(source):
        raise SystemExit(f"error: --from {source} is not a directory; name the folder that holds the data")
    archive, folder = os.path.join(source, make_dataset.ARCHIVE), os.path.join(source, make_dataset.FOLDER)
    if os.path.isfile(archive):
        return {make_dataset.ARCHIVE: archive}
    if os.path.isdir(folder):
        return {
            f"{make_dataset.FOLDER}/{n}": os.path.join(folder, n)
            for n in sorted(os.listdir(folder))
            if os.path.isfile(os.path.join(folder, n))
        }
    files = {
        os.path.relpath(os.path.join(root, n), source).replace(os.sep, "/"): os.path.join(root, n)
        for root, _, names in os.walk(source)
        for n in sorted(names)
    }
    if not files:
        raise SystemExit(f"error: {source} holds no files; name the directory that holds the data")
    return files


def check_destination(s3, bucket: str, prefix: str) -> None:
    """One line when the bucket is missing or not reachable with these credentials, or the prefix holds objects."""
    try:
        s3.head_bucket(Bucket=bucket)
        taken = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/", MaxKeys=1)["KeyCount"]
    except ClientError as e:
        code = e.response["Error"]["Code"]
        if code in ("404", "NoSuchBucket"):
            raise SystemExit(
                f"error: bucket {bucket} does not exist; make it in the jobs' region: aws s3 mb s3://{bucket}"
            ) from None
        raise SystemExit(f"error: bucket {bucket}: {e}; check the name and your s3:ListBucket permission") from None
    if taken:
        raise SystemExit(
            f"error: s3://{bucket}/{prefix}/ already holds objects, which the job would read too; "
            f"choose a new prefix, or empty it: aws s3 rm --recursive s3://{bucket}/{prefix}/"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("destination", help="s3://bucket/prefix, an empty prefix")
    parser.add_argument(
        "--from",
        dest="source",
        help="a local directory: every file under it (CIFAR-10's layouts: only its files); default: download CIFAR-10",
    )
    parser.add_argument(
        "--format",
        choices=["files", "litdata"],
        default="files",
        help="files: as they are; litdata: litdata's optimized chunks, which a job streams (scripts/optimize_data.py)",
    )
    parser.add_argument(
        "--chunk-bytes", default=optimize_data.DEFAULT_CHUNK_BYTES, help="with --format litdata: each chunk's size"
    )
    args = parser.parse_args()
    bucket, prefix = s3_prefix(args.destination)
    with tempfile.TemporaryDirectory(prefix="optimized-") as optimized:
        return upload(args, bucket, prefix, optimized)


def upload(args, bucket: str, prefix: str, optimized: str) -> int:
    """Check, download when no --from, convert for --format litdata (into `optimized`), upload; print the URI."""
    source = args.source
    files = dataset_files(source) if source else None  # local checks first: they are instant
    session = boto3.Session()
    aws_account.account(session, need_region=False)  # S3 needs no region; bad credentials stop here, before a download
    s3 = session.client("s3")
    check_destination(s3, bucket, prefix)
    if files is None:
        try:
            with contextlib.redirect_stdout(sys.stderr):  # torchvision's messages: stdout is the URI alone
                source = os.path.dirname(make_dataset.cifar10(DOWNLOADS))
        except (OSError, RuntimeError) as e:  # no network (URLError is an OSError), or a corrupt download
            raise SystemExit(
                f"error: cannot download CIFAR-10 ({e}); pass --from DIR, a directory with the data"
            ) from None
        files = dataset_files(source)
    if args.format == "litdata":
        print(f"optimizing {source} for litdata ({args.chunk_bytes} chunks)", file=sys.stderr)
        files = optimize_data.optimize(source, optimized, args.chunk_bytes)
    for name, path in files.items():
        print(
            f"uploading {path} ({os.path.getsize(path) / 1e6:.1f} MB) to s3://{bucket}/{prefix}/{name}", file=sys.stderr
        )
        try:
            s3.upload_file(path, bucket, f"{prefix}/{name}")  # multipart and parallel above 8 MB
        except (S3UploadFailedError, BotoCoreError, ClientError) as e:
            raise SystemExit(
                f"error: uploading {path} failed ({e}); empty s3://{bucket}/{prefix}/ and run again"
            ) from None
    print(
        f"s3://{bucket}/{prefix}/"
    )  # the trailing / keeps the channel from also matching sibling prefixes (cifar10-old/)
    return 0


if __name__ == "__main__":
    sys.exit(main())
