"""CIFAR-10 streamed with litdata, for data larger than the disk: batches come from chunks that are downloaded as they
are needed into a bounded cache (the job's: sagemaker_lightning/data/streaming.py), never the whole set first.

`data_dir` is what scripts/upload_data.py --format litdata wrote: an s3:// prefix with train/ and test/ below it,
each a dataset in litdata's optimized format; or a directory that holds them (a channel: in FastFile mode SageMaker
mounts it and the chunks are read in place). The training split is shuffled by litdata (chunks, then items within a
chunk); each image's crop and flip are drawn from a generator seeded by (seed, epoch, id), so a resumed run augments
as the uninterrupted one did in whichever worker loads it. Validation is the test split: a streamed split is fixed
when it is written (data.val_split does not apply).

    python scripts/make_dataset.py synthetic data/synthetic
    python scripts/upload_data.py s3://my-bucket/cifar10-litdata --format litdata --from data/synthetic
    python app/example/train.py --data=StreamingCIFAR10DataModule --data.data_dir s3://my-bucket/cifar10-litdata/
"""

import os

import numpy as np
import torch

from data import MEAN, PAD, SIZE, STD, CIFAR10Base, crop_and_flip
from sagemaker_lightning import UserError, check_source

SPLITS = {"train": "train", "test": "test"}  # split → the folder under data_dir that upload_data.py writes


def split_url(data_dir: str, split: str) -> str:
    return f"{data_dir.rstrip('/')}/{SPLITS[split]}" if data_dir.startswith("s3://") else os.path.join(data_dir, split)


class Augment:
    """An item of the optimized dataset ({"id", "image": uint8 SIZE×SIZE×3, "label"}) as (image tensor, label): for
    training cropped and flipped as data.py's SeededCrops does (crop_and_flip, seeded by (seed, epoch, id)); the
    epoch is its dataset's (set once the dataset exists: `dataset`)."""

    def __init__(self, seed: int, train: bool):
        self.seed, self.train, self.dataset = seed, train, None
        self.mean, self.std = np.asarray(MEAN, np.float32), np.asarray(STD, np.float32)

    def __call__(self, item: dict):
        image = np.asarray(item["image"], dtype=np.uint8)
        if self.train:
            dy, dx, flip = crop_and_flip(self.seed, self.dataset.current_epoch, int(item["id"]))
            image = np.pad(image, ((PAD, PAD), (PAD, PAD), (0, 0)))[dy : dy + SIZE, dx : dx + SIZE]
            if flip:
                image = image[:, ::-1]
        normalized = (image.astype(np.float32) / 255 - self.mean) / self.std
        return torch.from_numpy(np.ascontiguousarray(normalized.transpose(2, 0, 1))), int(item["label"])


class StreamingCIFAR10DataModule(CIFAR10Base):
    """CIFAR-10 streamed from S3 (or a channel) in litdata's optimized format (see the module's docstring)."""

    def __init__(self, *args, num_workers: int = 4, **kwargs):
        """
        Args:
            num_workers: DataLoader worker processes per training process (each downloads and decodes chunks).
        """
        super().__init__(*args, **kwargs)
        self.num_workers = num_workers

    def prepare_data(self) -> None:
        """Nothing to unpack or download: the chunks are read as the batches need them."""

    def _stream(self, split: str):
        from litdata import StreamingDataset  # made here: litdata reads the processes' ranks when a dataset is made

        check_source(split_url(self.data_dir, split))  # one line for a prefix with no optimized dataset, or unreadable
        train = split == "train"
        augment = Augment(self.seed, train)
        dataset = StreamingDataset(split_url(self.data_dir, split), shuffle=train, seed=self.seed, transform=augment)
        augment.dataset = dataset
        return dataset

    def setup(self, stage: str) -> None:
        if stage in ("fit", "validate"):
            self.train_set, self.val_set = self._stream("train"), self._stream("test")
        if stage == "test":
            self.test_set = self._stream("test")

    def _loader(self, dataset, train: bool):
        from litdata import StreamingDataLoader

        loader = StreamingDataLoader(dataset, batch_size=self.batch_size, num_workers=self.num_workers)
        if train and len(loader) == 0:
            raise UserError(
                f"data.batch_size={self.batch_size} is more than the training images of each process; lower it"
            )
        return loader
