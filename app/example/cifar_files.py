"""CIFAR-10's python batches read without running code, checked, as the images and labels torchvision's CIFAR10 gave.

Each batch file is a pickle, and a plain pickle.load runs whatever the pickle calls: whoever can write the job's data
channel could run code in the job. BatchUnpickler builds only what the format holds (a dict of str or bytes, ints,
lists and numpy arrays: the uint8 images, the labels as a list or an integer array), at pickle protocols 2 to 5; any
other class or function in a file, or _codecs.encode called with anything but text and "latin1", refuses the file
before anything is called. A file of another shape fails with one line too: it names the file and what is wrong.
batches.meta (label names) is never read.

    python scripts/make_dataset.py synthetic data/synthetic && tar -xzf data/synthetic/cifar-10-python.tar.gz -C data/synthetic
    python -c "import cifar_files; x, y = cifar_files.read_split('data/synthetic/cifar-10-batches-py', True, 10); print(x.shape, len(y))"
"""

import codecs
import os
import pickle
import tarfile
import zlib

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from sagemaker_lightning import UserError

try:  # numpy 2 names its internals numpy._core; the official files (numpy 1, 2009) name numpy.core
    from numpy._core.multiarray import _reconstruct
    from numpy._core.numeric import _frombuffer
except ImportError:
    from numpy.core.multiarray import _reconstruct
    from numpy.core.numeric import _frombuffer

ARCHIVE = "cifar-10-python.tar.gz"  # the official archive, what users upload to S3
FOLDER = "cifar-10-batches-py"  # the archive's folder of batch files
TRAIN_BATCHES = [f"data_batch_{i}" for i in range(1, 6)]  # the training images, in this order
TEST_BATCHES = ["test_batch"]
META = "batches.meta"  # label names: part of the format, never read here
SIZE = 32  # image height and width
IMAGE_BYTES = 3 * SIZE * SIZE  # one image in a batch's data: the red, green and blue planes, row by row
FIX = f"replace it with the file of the official {ARCHIVE} or one written by scripts/make_dataset.py"


class Refused(pickle.UnpicklingError):
    """A pickle names a class or function outside ADMITTED, or calls one with other arguments than a batch needs: the
    file is refused before anything is called."""


def _latin1(*args) -> bytes:
    """_codecs.encode as Python 3 pickles bytes at protocols 0-2 (an array's buffer too): (the bytes as latin1 text,
    "latin1"). It turns text into bytes; any other call is refused, not made."""
    if len(args) != 2 or type(args[0]) is not str or type(args[1]) is not str or args[1] != "latin1":
        raise Refused("_codecs.encode with other arguments than text and 'latin1'")
    return codecs.encode(args[0], "latin1")


# What numpy arrays pickle as, all a batch needs: its reconstructor for protocols 0-4 (the official files: protocol
# 2) and for protocol 5 (python 3.14's default), each under numpy 1's and numpy 2's module, and the bytes of Python 3's
# protocol 2 (_codecs.encode, checked: torch's weights-only unpickler admits it for the same files). Calling these
# builds arrays, dtypes and bytes, nothing else: no dtype here can hold objects (_frombuffer refuses them;
# _reconstruct's object arrays hold only what this unpickler builds).
ADMITTED = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1,
}


class BatchUnpickler(pickle.Unpickler):
    """pickle's Unpickler that builds only ADMITTED classes and functions. find_class is how GLOBAL, STACK_GLOBAL and
    INST name one; the only other way, copyreg's extension registry (EXT opcodes), is empty: nothing here registers."""

    def find_class(self, module: str, name: str):
        found = ADMITTED.get((module, name))
        if found is None:
            raise Refused(f"{module}.{name}")
        # Python functions: a pickle's BUILD could set their attributes for the whole process
        if found in (_frombuffer, _latin1):
            return lambda *args: found(*args)
        return found  # a builtin function or type: BUILD cannot change it


def _field(entry: dict, key: str):
    """entry[key], else entry[key as bytes] (a python 3 pickle of the format may keep bytes keys), else None."""
    return entry[key] if key in entry else entry.get(key.encode())


def _described(value) -> str:
    """What an unexpected value is, in a few words: `an array of float32, shape (2, 3072)`, `of type str`."""
    return (
        f"an array of {value.dtype}, shape {value.shape}"
        if isinstance(value, np.ndarray)
        else f"of type {type(value).__name__}"
    )


class LabelError(ValueError):
    """A well-formed batch whose labels do not fit data.num_classes: the fix is the setting or the labels."""


def checked(entry, num_classes: int) -> tuple[np.ndarray, list[int]]:
    """A batch's images (uint8 N×IMAGE_BYTES) and labels (N ints in 0..num_classes-1, from a list or an integer
    array); ValueError saying what else `entry` is (LabelError when only its labels are out of range)."""
    if not isinstance(entry, dict):
        raise ValueError(f"it holds a {type(entry).__name__}, not a dict")
    data, labels = _field(entry, "data"), _field(entry, "labels")
    for key, value in (("data", data), ("labels", labels)):
        if value is None:
            raise ValueError(f"it has no {key}")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != IMAGE_BYTES:
        raise ValueError(f"its data is {_described(data)}, not N×{IMAGE_BYTES} uint8 images")
    if isinstance(labels, np.ndarray) and labels.ndim == 1 and np.issubdtype(labels.dtype, np.integer):
        labels = labels.tolist()  # python ints, as a list holds them
    if not isinstance(labels, list):
        raise ValueError(f"its labels are {_described(labels)}, not a list or an integer array")
    if len(labels) != len(data):
        raise ValueError(f"its labels are {len(labels)} for {len(data)} images, not one per image")
    if not all(type(y) is int for y in labels):  # a bool is an int too; a numpy integer needs a refused class
        raise ValueError("its labels are not all integers")
    if not labels:
        raise ValueError("it holds no images")
    if outside := [y for y in labels if not 0 <= y < num_classes]:
        raise LabelError(f"must lie in 0..{num_classes - 1} (data.num_classes={num_classes}), not {outside[0]}")
    return data, labels


def read_batch(path: str, num_classes: int, opened=None) -> tuple[np.ndarray, list[int]]:
    """One batch file's images and labels (see `checked`); a UserError naming the file otherwise. `opened`: the file
    already open (a member of the archive), `path` then only names it."""
    try:
        with opened or open(path, "rb") as f:
            entry = BatchUnpickler(f, encoding="latin1").load()  # latin1: python 2's strings, as torchvision loads
    except Refused as e:
        raise UserError(
            f"{path} is not a CIFAR-10 batch: it calls {e}, which no batch needs (not run); {FIX}"
        ) from None
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror or e}); {FIX}") from None
    except Exception as e:  # whatever else a file's bytes make the unpickler or numpy raise: the file is not a batch
        raise UserError(f"{path} is not a CIFAR-10 batch ({type(e).__name__}: {e}); {FIX}") from None
    try:
        return checked(entry, num_classes)
    except LabelError as e:
        raise UserError(f"labels in {path} {e}; set data.num_classes or fix the labels") from None
    except ValueError as e:
        raise UserError(f"{path} is not a CIFAR-10 batch: {e}; {FIX}") from None


def archive_members(archive: str, names: list[str]):
    """The batch files `names` of the archive, as (name, open file) pairs read from it in place: only the members
    of those names are read, no member path is ever used, and nothing is written to disk (a FastFile channel
    streams the archive once, from S3)."""
    try:
        with tarfile.open(archive) as tar:
            for name in names:
                try:
                    member = tar.extractfile(f"{FOLDER}/{name}")
                except KeyError:
                    raise UserError(
                        f"{archive} has no {FOLDER}/{name}; pack the files as the official {ARCHIVE}"
                    ) from None
                if member is None:
                    raise UserError(
                        f"{archive}'s {FOLDER}/{name} is not a file; pack the files as the official {ARCHIVE}"
                    )
                yield f"{archive}:{FOLDER}/{name}", member
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise UserError(f"{archive} is not a readable tar.gz ({e}); upload the official {ARCHIVE}") from None


def read_split(source: str, train: bool, num_classes: int) -> tuple[np.ndarray, list[int]]:
    """A split's images (uint8 N×SIZE×SIZE×3, channels last: a view of the files' planes) and labels, in file order:
    torchvision's CIFAR10 `data` and `targets`, to the byte. `source`: the folder of batch files, or the archive."""
    names = TRAIN_BATCHES if train else TEST_BATCHES
    if os.path.isdir(source):
        batches = [read_batch(os.path.join(source, name), num_classes) for name in names]
    else:
        batches = [read_batch(path, num_classes, f) for path, f in archive_members(source, names)]
    images = np.vstack([data for data, _ in batches]).reshape(-1, 3, SIZE, SIZE).transpose((0, 2, 3, 1))
    return images, [y for _, labels in batches for y in labels]


class CIFAR10Files(Dataset):
    """A split's images and labels as torchvision's CIFAR10 holds them (`data`, `targets`): items are (the image as
    PIL, after `transform`; its label)."""

    def __init__(self, data: np.ndarray, targets: list[int], transform=None):
        self.data, self.targets, self.transform = data, targets, transform

    @classmethod
    def read(cls, source: str, train: bool, num_classes: int, transform=None) -> "CIFAR10Files":
        """From the folder of batch files, or from the archive itself."""
        return cls(*read_split(source, train, num_classes), transform)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        image = Image.fromarray(self.data[index])
        return (image if self.transform is None else self.transform(image)), self.targets[index]
