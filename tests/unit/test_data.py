"""The CIFAR-10 data module on generated files in the official format: both layouts, bad data, augmentation."""

import os
import shutil
import tarfile
import tempfile

import pytest
import torch

import make_dataset
from data import ARCHIVE, FOLDER, CIFAR10DataModule
from sagemaker_lightning import UserError

pytestmark = pytest.mark.unit


def setup(data_dir, **kwargs) -> CIFAR10DataModule:
    dm = CIFAR10DataModule(data_dir, batch_size=16, num_workers=0, **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_archive_is_unpacked_outside_data_dir(archive_dir):
    dm = setup(archive_dir, val_split=40)
    assert (len(dm.train_set), len(dm.val_set)) == (120, 40)
    assert os.listdir(archive_dir) == [ARCHIVE]  # the user's folder (or channel) is left as it was
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32 and y.max() < 10


def test_extracted_folder_loads(archive_dir, tmp_path):
    with tarfile.open(os.path.join(archive_dir, ARCHIVE)) as tar:
        tar.extractall(tmp_path)
    assert os.path.isdir(tmp_path / FOLDER)
    dm = setup(str(tmp_path), val_split=0.25)
    assert (len(dm.train_set), len(dm.val_set)) == (120, 40)


def test_val_split_zero_validates_on_the_test_set(archive_dir):
    dm = setup(archive_dir, val_split=0)
    assert (len(dm.train_set), len(dm.val_set)) == (160, 40)


def test_split_is_seeded(archive_dir):
    a, b, c = (setup(archive_dir, seed=s).val_set.indices for s in (1, 1, 2))
    assert a == b and a != c


def test_missing_data_names_the_directory(tmp_path):
    with pytest.raises(UserError, match=f"no CIFAR-10 data in {tmp_path}: expected {FOLDER}/ or {ARCHIVE}"):
        setup(str(tmp_path))


def test_corrupt_archive_is_named(tmp_path):
    (tmp_path / ARCHIVE).write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(UserError, match=f"{ARCHIVE} is not a readable tar.gz"):
        setup(str(tmp_path))


def test_archive_without_the_batches_is_named(tmp_path):
    with tarfile.open(tmp_path / ARCHIVE, "w:gz") as tar:
        tar.add(__file__, arcname="something/else.py")
    with pytest.raises(UserError, match=f"has no {FOLDER}/data_batch_1"):
        setup(str(tmp_path))


def test_corrupt_batch_file_is_named(archive_dir, tmp_path):
    with tarfile.open(os.path.join(archive_dir, ARCHIVE)) as tar:
        tar.extractall(tmp_path)
    (tmp_path / FOLDER / "data_batch_3").write_bytes(b"garbage")
    with pytest.raises(UserError, match="cannot read CIFAR-10 files"):
        setup(str(tmp_path))


def test_labels_must_fit_num_classes(archive_dir):
    with pytest.raises(UserError, match="labels .* must lie in 0..3"):
        setup(archive_dir, num_classes=4)


def test_val_split_must_leave_training_images(archive_dir):
    with pytest.raises(UserError, match="leaves no training images"):
        setup(archive_dir, val_split=160)


def test_synthetic_data_is_learnable():
    """Class means differ by far more than the noise: the demo can show learning in one short epoch."""
    import numpy as np

    pixels, labels = make_dataset.synthetic_images(2000, np.random.default_rng(0))
    images, labels = pixels.reshape(-1, 3, 32, 32).astype(float), np.array(labels)
    means = np.stack([images[labels == c].mean(0) for c in range(10)])
    nearest = np.argmin(((images[:, None] - means[None]) ** 2).sum((2, 3, 4)), axis=1)
    assert (nearest == labels).mean() > 0.95  # a nearest-class-mean classifier already separates them


def test_train_augmentation_crops_and_flips(archive_dir):
    """Padding 4 + random crop shifts images, flips mirror them, another way each epoch, the same way for the same
    (epoch, image) whatever the process's random state; evaluation images stay put."""
    dm = setup(archive_dir, val_split=0)
    base = dm._dataset(True, dm.eval_transform)[0][0]
    augmented = torch.stack([dm.train_set[epoch, 0][0] for epoch in range(20)])
    assert not all(torch.equal(a, base) for a in augmented)
    assert len({a.sum().item() for a in augmented}) > 5  # not one crop for every epoch
    torch.manual_seed(1)
    assert torch.equal(dm.train_set[3, 0][0], augmented[3])
    assert torch.equal(dm._dataset(True, dm.eval_transform)[0][0], base)


def test_generated_batches_fail_torchvisions_checksum(archive_dir, tmp_path):
    """Why CIFAR10Files exists: torchvision's own class refuses files that are not the official ones."""
    import torchvision

    with tarfile.open(os.path.join(archive_dir, ARCHIVE)) as tar:
        tar.extractall(tmp_path)
    with pytest.raises(RuntimeError, match="corrupted"):
        torchvision.datasets.CIFAR10(str(tmp_path), train=True)
    shutil.rmtree(tmp_path / FOLDER)


def test_two_runs_unpacking_the_same_archive_both_succeed(archive_dir, monkeypatch):
    """Two runs started at once on one machine with the same data_dir (two jobs, an experiment sweep) both unpack it;
    the one that finishes second finds the folder there, keeps it and removes its own copy."""
    dm = CIFAR10DataModule(archive_dir, num_workers=0)
    dm.prepare_data()  # the first run has unpacked it
    real_mkdtemp, made = tempfile.mkdtemp, []

    def mkdtemp(**kwargs):
        made.append(real_mkdtemp(**kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    dm._extract()  # the second, which had not found it when it started
    assert os.listdir(dm._extract_dir()) == [FOLDER] and not os.path.exists(made[0])
    setup(archive_dir)
