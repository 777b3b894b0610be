"""CIFAR-10 as LightningDataModules: the files, the split, and the DataLoader path.

`data_dir` holds either the extracted `cifar-10-batches-py/` or the official archive `cifar-10-python.tar.gz`
(what users upload to S3), read in place: a FastFile channel streams it from S3, nothing is copied to disk. Files in
the official format with other content (scripts/make_dataset.py) load too; a batch that would run code does not
(cifar_files.py reads them). CIFAR10Base finds, reads, checks and splits the files; CIFAR10DataModule augments in DataLoader workers (PIL transforms), device_data.DeviceCIFAR10DataModule
on the training device. Each training image's crop and flip are drawn from a generator seeded by (seed, epoch,
index): a resumed run augments as the uninterrupted one did, whichever worker process loads the image.

    python scripts/make_dataset.py synthetic data/synthetic
    python -c "import data; d = data.CIFAR10DataModule('data/synthetic'); d.prepare_data(); d.setup('fit'); print(len(d.train_set))"
"""

import copy
import os
import urllib.error

import pytorch_lightning as pl
import torch
import torchvision
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset
from torchvision import transforms as T
from torchvision.datasets.utils import download_and_extract_archive
from torchvision.transforms import functional as TF

from cifar_files import ARCHIVE, FOLDER, SIZE, CIFAR10Files
from sagemaker_lightning import ResumableDataLoader, UserError

MEAN = (0.4914, 0.4822, 0.4465)  # per-channel mean of the CIFAR-10 training images
STD = (0.2470, 0.2435, 0.2616)  # per-channel standard deviation of the same
PAD = 4  # training crops: SIZE×SIZE out of the image padded with PAD black pixels on each side


class CIFAR10Base(pl.LightningDataModule):
    """What every CIFAR-10 pipeline shares: finding, reading, checking and splitting the files.

    Subclasses turn the raw images (uint8, N×32×32×3) of a split into datasets (`_subset`) and batches.
    """

    def __init__(
        self,
        data_dir: str = "data/cifar10",
        batch_size: int = 128,
        val_split: int | float = 0.1,
        num_classes: int = 10,
        download: bool = False,
        seed: int = 42,
    ):
        """
        Args:
            data_dir: directory with cifar-10-batches-py/ or cifar-10-python.tar.gz.
            batch_size: images per batch on each process.
            val_split: images held out of the training set for validation: a fraction, a count, or 0 for the test set.
            num_classes: number of classes (labels must be below it).
            download: fetch the official CIFAR-10 into data_dir when it holds no data (needs internet).
            seed: seed of the train/validation split (DeviceCIFAR10DataModule: also of its shuffling and crops).
        """
        super().__init__()
        if batch_size < 1:  # else a DataLoader error (0) or a negative length (-4) at the first epoch
            raise UserError(
                f"data.batch_size={batch_size} is not a batch size: the images of each step on each process, "
                "1 or more (e.g. data.batch_size=128)"
            )
        self.data_dir = data_dir
        self.batch_size = batch_size
        self.val_split = val_split
        self.num_classes = num_classes
        self.download = download
        self.seed = seed

    def _source(self) -> str | None:
        """The folder cifar-10-batches-py/, else the archive, read in place (a FastFile channel streams it from S3,
        nothing is copied to disk); None when data_dir holds neither yet."""
        for source in (os.path.join(self.data_dir, FOLDER), os.path.join(self.data_dir, ARCHIVE)):
            if os.path.exists(source):
                return source
        return None

    def prepare_data(self) -> None:
        """Once per node (local rank 0): download when allowed and data_dir holds no data."""
        if self._source():
            return
        if self.download:
            official = torchvision.datasets.CIFAR10
            try:  # the md5-checked archive, unpacked; read as any data_dir is, never by torchvision's pickle.load
                download_and_extract_archive(official.url, self.data_dir, filename=ARCHIVE, md5=official.tgz_md5)
            except (urllib.error.URLError, OSError) as e:
                raise UserError(
                    f"cannot download CIFAR-10 into {self.data_dir} ({e}); put the data there instead"
                ) from e
        else:
            raise UserError(
                f"no CIFAR-10 data in {os.path.abspath(self.data_dir)}: expected {FOLDER}/ or {ARCHIVE}; "
                "give the job's data channel the data, or pass --data.download true where there is internet"
            )

    def _dataset(self, train: bool, transform=None) -> CIFAR10Files:
        if self._source() is None:
            self.prepare_data()  # setup() without prepare_data(), as in a notebook
        return CIFAR10Files.read(self._source(), train, self.num_classes, transform)

    def _subset(self, files: CIFAR10Files, indices: list[int] | None, augment: bool):
        """The images of `files` at `indices` (None: all) as this pipeline's dataset, augmented for training or not."""
        raise NotImplementedError

    def _loader(self, dataset, train: bool):
        """This pipeline's batches of `dataset` (a `_subset`): shuffled and augmented for training or not."""
        raise NotImplementedError

    def train_dataloader(self):
        return self._loader(self.train_set, train=True)

    def val_dataloader(self):
        return self._loader(self.val_set, train=False)

    def test_dataloader(self):
        return self._loader(self.test_set, train=False)

    def sampler(self, dataset, train: bool, kind: type[DistributedSampler] = DistributedSampler) -> DistributedSampler:
        """This process's share, made here rather than by Lightning (which would rebuild the loader around its own):
        for training one seeded permutation per epoch, the same on every rank, of which rank r takes every
        world_size-th index; full batches only, so every rank takes the same number of steps."""
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)
        return kind(dataset, num_replicas=world, rank=rank, shuffle=train, seed=self.seed, drop_last=train)

    def setup(self, stage: str) -> None:
        if stage == "fit" or stage == "validate":
            train_files = self._dataset(True)
            n = len(train_files)
            n_val = int(self.val_split * n) if isinstance(self.val_split, float) else self.val_split
            if not 0 <= n_val < n:
                raise UserError(f"data.val_split={self.val_split} leaves no training images out of {n}")
            if n_val == 0:
                self.train_set = self._subset(train_files, None, True)
                self.val_set = self._subset(self._dataset(False), None, False)
            else:
                order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed)).tolist()
                self.train_set = self._subset(train_files, order[n_val:], True)
                self.val_set = self._subset(train_files, order[:n_val], False)
        if stage == "test":
            self.test_set = self._subset(self._dataset(False), None, False)


class EpochIndices(DistributedSampler):
    """DistributedSampler's indices, each with its epoch: (epoch, index), the keys of SeededCrops."""

    def __iter__(self):
        epoch = self.epoch
        return ((epoch, i) for i in super().__iter__())


def crop_and_flip(seed: int, epoch: int, index: int) -> tuple[int, int, bool]:
    """A training image's crop (its top and left in the image padded by PAD) and whether it is flipped, as
    RandomCrop(SIZE, padding=PAD) and RandomHorizontalFlip draw them, from a generator seeded by (seed, epoch, index):
    a resumed run draws what the uninterrupted one drew, in whichever process."""
    generator = torch.Generator().manual_seed(hash((seed, epoch, index)) & 0xFFFF_FFFF_FFFF_FFFF)
    dy, dx = torch.randint(0, 2 * PAD + 1, (2,), generator=generator).tolist()
    return dy, dx, torch.rand(1, generator=generator).item() < 0.5


class SeededCrops(Dataset):
    """Images (PIL) of `images` cropped and flipped as RandomCrop(SIZE, padding=PAD) and RandomHorizontalFlip draw
    them, but drawn by crop_and_flip, then `finish`ed: keyed by (epoch, index)."""

    def __init__(self, images: Dataset, seed: int, finish):
        self.images, self.seed, self.finish = images, seed, finish

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, key: tuple[int, int]):
        epoch, index = key
        image, label = self.images[index]
        dy, dx, flip = crop_and_flip(self.seed, epoch, index)
        image = TF.crop(TF.pad(image, PAD), dy, dx, SIZE, SIZE)
        if flip:
            image = TF.hflip(image)
        return self.finish(image), label


class CIFAR10DataModule(CIFAR10Base):
    """The DataLoader path: PIL transforms in worker processes, batches copied to the device by Lightning."""

    def __init__(self, *args, num_workers: int = 4, **kwargs):
        """
        Args:
            num_workers: DataLoader worker processes per training process.
        """
        super().__init__(*args, **kwargs)
        self.num_workers = num_workers
        self.eval_transform = T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])

    def _subset(self, files: CIFAR10Files, indices: list[int] | None, augment: bool):
        dataset = copy.copy(files)  # shares the images with `files`; only the transform is its own
        dataset.transform = None if augment else self.eval_transform
        dataset = dataset if indices is None else Subset(dataset, indices)
        return SeededCrops(dataset, self.seed, self.eval_transform) if augment else dataset

    def _loader(self, dataset, train: bool) -> DataLoader:
        return (ResumableDataLoader if train else DataLoader)(
            dataset,
            batch_size=self.batch_size,
            sampler=self.sampler(dataset, train, EpochIndices if train else DistributedSampler),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=torch.cuda.is_available(),
            drop_last=train,  # equal batches on every rank: no tiny last step with its own noisy gradient
        )
