"""The CIFAR-10 data module on generated files in the official format: both layouts, bad data, augmentation, and
batch files that would run code.

    .venv/bin/python -m pytest tests/unit/example/test_data.py -q
"""

import codecs
import io
import os
import pickle
import re
import struct
import tarfile
import tempfile

import numpy as np
import pytest
import torch
import torchvision

import cifar_files
import make_dataset
from data import ARCHIVE, FOLDER, CIFAR10DataModule
from device_data import DeviceCIFAR10DataModule
from sagemaker_lightning import UserError

pytestmark = pytest.mark.unit


def setup(data_dir, **kwargs) -> CIFAR10DataModule:
    dm = CIFAR10DataModule(data_dir, batch_size=16, num_workers=0, **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def unpacked(archive_dir, tmp_path) -> str:
    """The archive's cifar-10-batches-py/ extracted into tmp_path: the data_dir layout whose files a test changes."""
    with tarfile.open(os.path.join(archive_dir, ARCHIVE)) as tar:
        tar.extractall(tmp_path, filter="data")
    return str(tmp_path / FOLDER)


def test_the_archive_is_read_in_place(archive_dir, tmp_path, monkeypatch):
    """Nothing is unpacked, in data_dir (a channel: FastFile mounts it read-only) or anywhere else: the archive's
    batches are read from it as it streams."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dm = setup(archive_dir, val_split=40)
    assert (len(dm.train_set), len(dm.val_set)) == (120, 40)
    assert os.listdir(archive_dir) == [ARCHIVE] and os.listdir(tmp_path) == []
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32 and y.max() < 10


def test_extracted_folder_loads(archive_dir, tmp_path):
    unpacked(archive_dir, tmp_path)
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
    path = os.path.join(unpacked(archive_dir, tmp_path), "data_batch_3")
    with open(path, "wb") as f:
        f.write(b"garbage")
    with pytest.raises(UserError, match=f"{re.escape(path)} is not a CIFAR-10 batch"):
        setup(str(tmp_path))


class MakesDirectory:
    """Unpickled, runs os.mkdir(path): what a planted batch can do with a plain pickle.load."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


@pytest.mark.parametrize("module", [CIFAR10DataModule, DeviceCIFAR10DataModule])
def test_a_batch_that_would_run_code_is_refused_unrun(archive_dir, tmp_path, module):
    """A data_batch whose pickle calls os.mkdir: the directory is never made, one line names the file and the call."""
    path = os.path.join(unpacked(archive_dir, tmp_path), "data_batch_2")
    with open(path, "rb") as f:
        batch = pickle.load(f)
    marker = str(tmp_path / "ran")
    with open(path, "wb") as f:  # still a well-formed batch: only the code in it can give it away
        pickle.dump({**batch, "batch_label": MakesDirectory(marker)}, f)
    dm = module(str(tmp_path), batch_size=16, val_split=0)
    with pytest.raises(UserError, match=f"{re.escape(path)} is not a CIFAR-10 batch: it calls posix.mkdir") as raised:
        dm.setup("fit")
    assert not os.path.exists(marker)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "content, problem",
    [
        ([1, 2, 3], "it holds a list, not a dict"),
        ({"labels": [0]}, "it has no data"),
        (
            {"data": np.zeros((2, 3072), np.float32), "labels": [0, 1]},
            "its data is an array of float32, shape \\(2, 3072\\), not N×3072 uint8 images",
        ),
        ({"data": np.zeros((2, 3072), np.uint8), "labels": [0]}, "its labels are 1 for 2 images"),
        (
            {"data": np.zeros((2, 3072), np.uint8), "labels": np.zeros(2, np.float32)},
            "its labels are an array of float32, shape \\(2,\\), not a list or an integer array",
        ),
        ({"data": np.zeros((2, 3072), np.uint8), "labels": [0, "1"]}, "its labels are not all integers"),
        ({"data": np.zeros((0, 3072), np.uint8), "labels": []}, "it holds no images"),
    ],
)
def test_a_batch_of_another_shape_is_named(archive_dir, tmp_path, content, problem):
    """Not the format's dict of N×3072 uint8 images and N labels: one line naming the file and what is wrong,
    not torchvision's TypeError (a list) or KeyError."""
    path = os.path.join(unpacked(archive_dir, tmp_path), "data_batch_1")
    with open(path, "wb") as f:
        pickle.dump(content, f)
    with pytest.raises(UserError, match=f"{re.escape(path)} is not a CIFAR-10 batch: {problem}") as raised:
        setup(str(tmp_path))
    assert "\n" not in str(raised.value)


LABELS = {"list": lambda labels: labels, "int array": np.array, "uint8 array": lambda y: np.array(y, np.uint8)}


@pytest.mark.parametrize("labels", LABELS)
@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_batches_of_every_protocol_with_labels_as_a_list_or_an_integer_array_are_read(
    archive_dir, tmp_path, protocol, labels
):
    """Issue 48, item 10: Python 3 pickles bytes at protocol 2 as _codecs.encode(text, "latin1"), so every array's
    buffer in such a file named it, and the reader refused the file; labels in a numpy array were refused too. Both
    read as the official file does, to the byte, the labels as python ints."""
    folder = unpacked(archive_dir, tmp_path)
    path = os.path.join(folder, "data_batch_1")
    expected = cifar_files.read_batch(path, 10)
    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="latin1")
    with open(path, "wb") as f:
        pickle.dump({**batch, "labels": LABELS[labels](batch["labels"])}, f, protocol=protocol)
    data, read = cifar_files.read_batch(path, 10)
    assert data.tobytes() == expected[0].tobytes() and read == expected[1] and {type(y) for y in read} == {int}


class Encodes:
    """Unpickled, calls _codecs.encode with `args` (as Python 3's protocol 2 does with ("text", "latin1"))."""

    def __init__(self, *args):
        self.args = args

    def __reduce__(self):
        return codecs.encode, self.args


@pytest.mark.parametrize("args", [("text", "rot13"), (b"\x00", "hex"), ("text",), ("text", "latin1", "strict")])
def test_codecs_encode_with_other_arguments_is_refused_uncalled(archive_dir, tmp_path, monkeypatch, args):
    """Issue 48, item 10: _codecs.encode is admitted for text and "latin1" only; any other call is refused before
    it is made, in one line naming the file."""
    path = os.path.join(unpacked(archive_dir, tmp_path), "data_batch_1")
    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="latin1")
    with open(path, "wb") as f:
        pickle.dump({**batch, "batch_label": Encodes(*args)}, f, protocol=3)  # its arrays' bytes need no call
    monkeypatch.setattr(codecs, "encode", lambda *a: pytest.fail(f"codecs.encode{a} was called"))
    with pytest.raises(UserError, match=f"{re.escape(path)} is not a CIFAR-10 batch: it calls _codecs.encode with "
                       "other arguments than text and 'latin1', which no batch needs \\(not run\\)"):  # fmt: skip
        cifar_files.read_batch(path, 10)


def test_labels_must_fit_num_classes(archive_dir):
    with pytest.raises(UserError, match=f"labels in .*{FOLDER}/data_batch_1 must lie in 0..3"):
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


class TorchvisionFiles(torchvision.datasets.CIFAR10):
    """The example's reader before issue 37: torchvision's, checksums off (md5 None means "exists")."""

    train_list = [[name, None] for name, _ in torchvision.datasets.CIFAR10.train_list]
    test_list = [[name, None] for name, _ in torchvision.datasets.CIFAR10.test_list]
    meta = {**torchvision.datasets.CIFAR10.meta, "md5": None}


class Python2Pickler(pickle._Pickler):
    """Pickles as python 2 wrote the official batches: protocol 2, every string 8-bit (BINSTRING), not unicode."""

    def save_binstring(self, obj: str | bytes):
        raw = obj.encode("latin1") if isinstance(obj, str) else obj
        size = len(raw)
        self.write(pickle.SHORT_BINSTRING + bytes([size]) if size < 256 else pickle.BINSTRING + struct.pack("<i", size))
        self.write(raw)
        self.memoize(obj)

    dispatch = {**pickle._Pickler.dispatch, str: save_binstring, bytes: save_binstring}


def python2_batch(batch: dict) -> bytes:
    """`batch` as python 2 and numpy 1.x pickled the official files: numpy's reconstructor under its old module."""
    out = io.BytesIO()
    Python2Pickler(out, protocol=2).dump(batch)
    return out.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")


FLAVORS = {  # a batch dict -> its file: the ways the format is written
    "python 2 (the official files)": python2_batch,
    "protocol 4": lambda batch: pickle.dumps(batch, protocol=4),
    "protocol 5 (python 3.14's default)": lambda batch: pickle.dumps(batch, protocol=5),
    "bytes keys": lambda batch: pickle.dumps({key.encode(): value for key, value in batch.items()}),
}


@pytest.mark.parametrize("flavor", FLAVORS)
def test_images_and_labels_are_torchvisions(archive_dir, tmp_path, flavor):
    """The reader gives what torchvision's CIFAR10 gave on the same content, to the byte: resumed runs see the same
    images in the same order. The official files pickle numpy arrays with python 2; generated ones with python 3."""
    folder = unpacked(archive_dir, tmp_path / "written")
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(os.path.join(folder, name), "rb") as f:
            batch = pickle.load(f)
        with open(os.path.join(folder, name), "wb") as f:
            f.write(FLAVORS[flavor](batch))
    if flavor.startswith("python 2"):
        with open(os.path.join(folder, "test_batch"), "rb") as f:
            assert f.read(2) == b"\x80\x02" and b"cnumpy.core.multiarray\n_reconstruct\n" in f.read()
    dm = CIFAR10DataModule(str(tmp_path / "written"), num_workers=0)
    unpacked(archive_dir, tmp_path / "as generated")
    for train in (True, False):
        ours, theirs = dm._dataset(train), TorchvisionFiles(str(tmp_path / "as generated"), train)
        n = 160 if train else 40
        assert ours.data.dtype == theirs.data.dtype and ours.data.shape == theirs.data.shape == (n, 32, 32, 3)
        assert ours.data.tobytes() == theirs.data.tobytes()
        assert ours.targets == theirs.targets and {type(y) for y in ours.targets} == {int}
        assert np.asarray(ours[7][0]).tobytes() == np.asarray(theirs[7][0]).tobytes() and ours[7][1] == theirs[7][1]
