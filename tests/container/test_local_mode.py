"""The image in SageMaker local mode: the real SDK v2 Estimator starts containers with docker compose."""

import re
import tarfile

import pytest

from model import ImageClassifier

pytestmark = pytest.mark.container

TINY = ["trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "trainer.accelerator=cpu",
        "trainer.enable_progress_bar=False", "data.batch_size=16"]  # fmt: skip


def model_tar(output: str) -> str:
    (path,) = re.findall(r"^model\.tar\.gz: (\S+)$", output, re.M)
    return path


def ranks(output: str) -> dict[int, tuple[str, int, str]]:
    """{global rank: (container's host, world size, final weights)} from each container's log lines."""
    found = re.findall(r"(algo-\d+-\w+)\s*\|\s*rank (\d+)/(\d+) host (\S+): weights (\w+)", output)
    return {int(rank): (host, int(world), digest) for container, rank, world, host, digest in found if container == host}


def unpacked(tar_path, tmp_path) -> str:
    with tarfile.open(tar_path) as tar:
        assert sorted(tar.getnames()) == ["config.yaml", "model.pt"]
        tar.extractall(tmp_path / "model")
    return str(tmp_path / "model")


def test_one_instance(local_job, archive_dir, tmp_path):
    code, output, _ = local_job(1, archive_dir, *TINY)
    assert code == 0, output[-5000:]
    assert [world for _, world, _ in ranks(output).values()] == [1]
    ImageClassifier.from_model_dir(unpacked(model_tar(output), tmp_path))


def test_two_instances_train_one_model(local_job, archive_dir, tmp_path):
    code, output, runs = local_job(2, archive_dir, *TINY)
    assert code == 0, output[-5000:]
    found = ranks(output)
    assert sorted(found) == [0, 1], output[-5000:]
    assert found[0][0].startswith("algo-1-") and found[1][0].startswith("algo-2-")  # each host its own rank
    assert {world for _, world, _ in found.values()} == {2}
    assert found[0][2] == found[1][2]  # the same final weights on both hosts
    tar_path = model_tar(output)
    assert tar_path.startswith(str(runs)) and "/lightning-" in tar_path  # the job's own folder under --output
    ImageClassifier.from_model_dir(unpacked(tar_path, tmp_path))
