"""The small job's project, as a user writes one: a model, and data modules whose every training sample carries its
id (a map-style dataset behind a plain DataLoader, an iterable dataset, litdata's streamed data, and the example's
two pipelines with each image's label replaced by its id). Written once for either Lightning package: each class
names its base (lightning_package.made makes it a class of the run's package); the example's are pytorch_lightning's.

    .venv/bin/python -c "from oracle import project; print(project.features([0, 1]))"
"""

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, IterableDataset

import data
import device_data

IDS, VAL_IDS, FEATURES, CLASSES = 16, 8, 8, 4  # an epoch's ids, the validation's (after them), inputs, classes


def features(ids) -> torch.Tensor:
    """Each id's input: fixed, different for every id."""
    return torch.stack([torch.randn(FEATURES, generator=torch.Generator().manual_seed(int(i))) for i in ids])


class Ids(Dataset):
    """A user's map-style dataset: sample i is (its features, its id)."""

    def __init__(self, ids):
        self.ids, self.x = list(ids), features(ids)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return self.x[i], self.ids[i]


class IterableIds(IterableDataset):
    """A user's iterable dataset, sharded by rank as its own code does it, in one seeded order."""

    def __init__(self, ids, rank: int, world: int):
        self.ids, self.rank, self.world = list(ids), rank, world

    def __iter__(self):
        order = torch.randperm(len(self.ids), generator=torch.Generator().manual_seed(0)).tolist()
        for i in order[self.rank :: self.world]:
            yield features([self.ids[i]])[0], self.ids[i]


class UserData:
    """A user's data module written the ordinary way: shuffled DataLoaders, or an iterable dataset."""

    BASE = "LightningDataModule"  # of the run's Lightning package (lightning_package.made)

    def __init__(self, batch_size: int = 2, num_workers: int = 0, iterable: bool = False):
        super().__init__()
        self.batch_size, self.num_workers, self.iterable = batch_size, num_workers, iterable

    def train_dataloader(self):
        if self.iterable:
            dataset = IterableIds(range(IDS), self.trainer.global_rank, self.trainer.world_size)
            return DataLoader(dataset, batch_size=self.batch_size)
        workers = {"num_workers": self.num_workers, "persistent_workers": self.num_workers > 0}
        return DataLoader(Ids(range(IDS)), batch_size=self.batch_size, shuffle=True, **workers)

    def val_dataloader(self):
        return DataLoader(Ids(range(IDS, IDS + VAL_IDS)), batch_size=self.batch_size)


class StreamedData:
    """A user's litdata dataset in a local folder (runs.streamed_ids writes it), streamed as litdata's docs do."""

    BASE = "LightningDataModule"

    def __init__(self, data_dir: str = "", batch_size: int = 2):
        super().__init__()
        self.data_dir, self.batch_size = data_dir, batch_size

    def train_dataloader(self):
        from litdata import StreamingDataLoader, StreamingDataset

        dataset = StreamingDataset(self.data_dir, shuffle=True, seed=7, drop_last=True)
        return StreamingDataLoader(dataset, batch_size=self.batch_size, collate_fn=_pairs)

    def val_dataloader(self):
        return DataLoader(Ids(range(IDS, IDS + VAL_IDS)), batch_size=self.batch_size)


def _pairs(samples):
    return features([s["id"] for s in samples]), torch.tensor([s["id"] for s in samples])


def image_ids(n: int, indices, augment: bool) -> list[int]:
    """The ids of the images a split takes: training images by their index, validation's (the test set's) after them."""
    return [i if augment else IDS + i for i in (range(n) if indices is None else indices)]


class DeviceIds(device_data.DeviceCIFAR10DataModule):
    """The example's device-resident pipeline, each image's label replaced by its id."""

    def _subset(self, files, indices, augment):
        images = super()._subset(files, indices, augment)
        ids = torch.as_tensor(image_ids(len(files), indices, augment), device=images.labels.device)
        return device_data.DeviceImages(images.padded, ids)


class Relabelled(Dataset):
    """(image, label) pairs as (image, id): the id of the image its key (an index, or (epoch, index)) names."""

    def __init__(self, images: Dataset, ids: list[int]):
        self.images, self.ids = images, ids

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, key):
        return self.images[key][0], self.ids[key[1] if isinstance(key, tuple) else key]


class ExampleIds(data.CIFAR10DataModule):
    """The example's DataLoader pipeline (its workers crop each image as its epoch and index seed), each image's label
    replaced by its id."""

    def _subset(self, files, indices, augment):
        return Relabelled(super()._subset(files, indices, augment), image_ids(len(files), indices, augment))


class Tiny:
    """A linear classifier with dropout (random numbers every step) and momentum (optimizer state); its validation
    draws too, as a generative model's samples do."""

    BASE = "LightningModule"

    def __init__(self, features: int = FEATURES):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.2), torch.nn.Linear(features, CLASSES))

    def training_step(self, batch, batch_idx):
        x, ids = batch
        return F.cross_entropy(self.net(x.float()), ids % CLASSES)

    def validation_step(self, batch, batch_idx):
        x, ids = batch
        noise = torch.rand_like(x, dtype=torch.float) * 1e-3  # a draw from the generators training draws from too
        self.log("val/loss", F.cross_entropy(self.net(x.float() + noise), ids % CLASSES))  # no collective a batch

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
