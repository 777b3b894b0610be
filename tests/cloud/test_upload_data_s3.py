"""scripts/upload_data.py against moto's S3: what lands under the prefix, the URI it prints, and bad input.

.venv/bin/pytest tests/cloud/test_upload_data_s3.py -q
"""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import boto3
import numpy as np
import pytest

import aws_account
import make_dataset

pytestmark = pytest.mark.cloud
UPLOAD = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts", "upload_data.py"
)
BUCKET = "datasets"


@pytest.fixture
def s3(aws):
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    return client


def upload(*args: str, cwd: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, UPLOAD, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def contents(s3, prefix: str) -> dict[str, bytes]:
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]
    return {key: s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() for key in keys}


def test_the_archive_goes_up_whole_and_the_uri_names_the_prefix(s3, tmp_path):
    """3,000 images make a 9 MB archive: above boto3's 8 MiB threshold, so a multipart upload."""
    archive = make_dataset.synthetic(str(tmp_path), train=3000, test=100, seed=0)
    proc = upload(f"s3://{BUCKET}/cifar10", "--from", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"s3://{BUCKET}/cifar10/\n"  # stdout: the URI alone; the / keeps out sibling prefixes
    with open(archive, "rb") as f:
        assert contents(s3, "") == {f"cifar10/{make_dataset.ARCHIVE}": f.read()}


def test_an_extracted_folder_goes_up_file_by_file(s3, archive_dir, tmp_path):
    with tarfile.open(os.path.join(archive_dir, make_dataset.ARCHIVE)) as tar:
        tar.extractall(tmp_path, filter="data")
    proc = upload(f"s3://{BUCKET}/nested/cifar/", "--from", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"s3://{BUCKET}/nested/cifar/\n"
    folder = tmp_path / make_dataset.FOLDER
    expected = {f"nested/cifar/{make_dataset.FOLDER}/{p.name}": p.read_bytes() for p in folder.iterdir()}
    assert len(expected) == 7 and contents(s3, "") == expected


@pytest.mark.parametrize(
    "case, destination, message",
    [
        ("no prefix", f"s3://{BUCKET}", "'s3://datasets' is not s3://bucket/prefix; "),
        ("no bucket", "s3://no-such-bucket/cifar10", "bucket no-such-bucket does not exist; "),
        ("no data", f"s3://{BUCKET}/cifar10", "holds no files; name the directory that holds the data"),
        ("prefix taken", f"s3://{BUCKET}/cifar10", f"s3://{BUCKET}/cifar10/ already holds objects, "),
        ("no network", f"s3://{BUCKET}/cifar10", "cannot download CIFAR-10 ("),
    ],
)
def test_bad_input_is_one_line_and_uploads_nothing(s3, archive_dir, tmp_path, free_port, case, destination, message):
    args, env = ["--from", archive_dir], {}
    if case == "no data":
        args = ["--from", str(tmp_path)]
    elif case == "prefix taken":
        s3.put_object(Bucket=BUCKET, Key="cifar10/old-file", Body=b"stale")
    elif (
        case == "no network"
    ):  # no --from: the download's HTTPS goes to a closed port (moto is plain HTTP: not proxied)
        closed = f"http://127.0.0.1:{free_port()}"
        args, env = [], {"HTTPS_PROXY": closed, "https_proxy": closed}
    before = contents(s3, "")
    proc = upload(destination, *args, cwd=str(tmp_path), env=env)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and message in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stdout == "", proc.stderr
    assert contents(s3, "") == before


def test_without_credentials_it_stops_before_downloading(no_aws, tmp_path):
    proc = upload("s3://any-bucket/cifar10", cwd=str(tmp_path))
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        1,
        "",
        f"error: no AWS credentials found; {aws_account.SETUP}\n",
    )
    assert not (tmp_path / "data").exists()


def test_a_projects_own_data_goes_up_as_the_readme_shows(s3, points_dir):
    """README, "Your own project in the cloud": python scripts/upload_data.py s3://BUCKET/points --from DIR."""
    proc = upload(f"s3://{BUCKET}/points", "--from", points_dir)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"s3://{BUCKET}/points/\n"
    expected = {f"points/{name}": Path(points_dir, name).read_bytes() for name in os.listdir(points_dir)}
    assert contents(s3, "points/") == expected and expected


def test_format_litdata_goes_up_as_chunks_that_stream_back_as_the_images(s3, archive_dir):
    """--format litdata: train/ and test/ in litdata's optimized format, several chunks each; streamed back from S3
    (moto: a plain-http endpoint, as the runtime allows it) they are the archive's images and labels, each with its
    index as id."""
    from litdata import StreamingDataset

    from cifar_files import read_split
    from sagemaker_lightning.data import streaming

    proc = upload(f"s3://{BUCKET}/cifar-litdata", "--from", archive_dir, "--format", "litdata", "--chunk-bytes", "64KB")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"s3://{BUCKET}/cifar-litdata/\n"
    keys = contents(s3, "cifar-litdata/")
    for split, n in (("train", 160), ("test", 40)):
        assert f"cifar-litdata/{split}/index.json" in keys
        assert len([k for k in keys if k.startswith(f"cifar-litdata/{split}/chunk-")]) > 1
        streaming.check_source(f"s3://{BUCKET}/cifar-litdata/{split}")  # an optimized dataset: no error
        streaming.allow_plain_http(None)
        dataset = StreamingDataset(f"s3://{BUCKET}/cifar-litdata/{split}")
        images, labels = read_split(os.path.join(archive_dir, make_dataset.ARCHIVE), split == "train", 10)
        items = [dataset[i] for i in range(len(dataset))]
        assert [int(item["id"]) for item in items] == list(range(n))
        assert [int(item["label"]) for item in items] == labels
        assert all(np.array_equal(np.asarray(item["image"]), images[i]) for i, item in enumerate(items))


def test_a_prefix_that_is_no_optimized_dataset_or_cannot_be_read_is_one_line(s3, archive_dir):
    """What a job's streaming data module checks first (sagemaker_lightning.data.streaming.check_source): litdata itself
    fails on each with a bare 404 of HeadObject."""
    from sagemaker_lightning import UserError
    from sagemaker_lightning.data import streaming

    assert upload(f"s3://{BUCKET}/cifar10", "--from", archive_dir).returncode == 0  # the archive, not chunks
    cases = {
        f"s3://{BUCKET}/cifar10": f"s3://{BUCKET}/cifar10 is not a dataset litdata optimized: it has no index.json "
        f"(holds cifar10/{make_dataset.ARCHIVE}); write one with scripts/upload_data.py --format litdata",
        f"s3://{BUCKET}/nothing": f"s3://{BUCKET}/nothing is not a dataset litdata optimized: it has no index.json "
        "(is empty)",
        "s3://no-such-bucket/cifar10": "bucket no-such-bucket of s3://no-such-bucket/cifar10 does not exist",
    }
    for uri, line in cases.items():
        with pytest.raises(UserError) as raised:
            streaming.check_source(uri)
        assert str(raised.value).startswith(line), str(raised.value)
