"""scripts/upload_data.py's local checks: the S3 prefix and what of a directory goes up."""

import os
import shutil
import tarfile

import pytest

import make_dataset
import upload_data

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "uri, expected",
    [("s3://b/cifar10", ("b", "cifar10")), ("s3://b/a/b/", ("b", "a/b")), ("s3://b//a//", ("b", "a"))],
)
def test_s3_prefixes(uri, expected):
    assert upload_data.s3_prefix(uri) == expected


@pytest.mark.parametrize("uri", ["s3://b", "s3://b/", "b/cifar10", "file:///data", "s3:///cifar10"])
def test_anything_but_a_bucket_and_prefix_is_one_line(uri):
    with pytest.raises(SystemExit, match=r"^error: .* is not s3://bucket/prefix; e\.g\. s3://my-bucket/cifar10$"):
        upload_data.s3_prefix(uri)


def test_the_archive_is_preferred_to_the_folder(archive_dir, tmp_path):
    """torchvision's download leaves both layouts: one archive object is all the trainer needs."""
    archive = shutil.copy(os.path.join(archive_dir, make_dataset.ARCHIVE), tmp_path)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data")
    assert upload_data.dataset_files(str(tmp_path)) == {make_dataset.ARCHIVE: archive}
    os.remove(archive)
    assert sorted(upload_data.dataset_files(str(tmp_path))) == sorted(
        f"{make_dataset.FOLDER}/{n}" for n in os.listdir(tmp_path / make_dataset.FOLDER)
    )


def test_any_other_folder_goes_up_whole_at_its_relative_names(tmp_path):
    (tmp_path / "shards").mkdir()
    (tmp_path / "points.pt").write_bytes(b"0")
    (tmp_path / "shards" / "0.bin").write_bytes(b"1")
    assert upload_data.dataset_files(str(tmp_path)) == {
        "points.pt": str(tmp_path / "points.pt"),
        "shards/0.bin": str(tmp_path / "shards" / "0.bin"),
    }


@pytest.mark.parametrize("what", ["empty", "missing"])
def test_a_folder_without_files_is_one_line(tmp_path, what):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(SystemExit, match=r"^error: .* (holds no files|is not a directory); name the "):
        upload_data.dataset_files(str(tmp_path / what))
