"""CIFAR-10 resident on the training device: each process loads the uint8 images onto its device once, then crops,
flips and normalizes every batch there. No worker processes and no host-to-device copy per step, so a GPU never
waits for CPUs to augment images (the DataLoader path of data.py feeds a few thousand images/s per worker at best).

The augmentation is the DataLoader path's: a SIZE×SIZE crop at a uniform offset of the image padded with PAD black
pixels, then a horizontal flip with probability 1/2, then ToTensor's /255 and the same Normalize(MEAN, STD).
The sharding is DistributedSampler's: each epoch one seeded permutation of the training set, the same on every rank,
of which rank r takes every world_size-th index from r.

    python scripts/make_dataset.py synthetic data/synthetic
    python -c "import device_data as d; m = d.DeviceCIFAR10DataModule('data/synthetic'); m.setup('fit'); x, y = next(iter(m.train_dataloader())); print(x.shape, x.device)"
"""

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F
from torch.utils.data import DistributedSampler

from cifar_files import CIFAR10Files
from data import MEAN, PAD, SIZE, STD, CIFAR10Base
from sagemaker_lightning import ResumableEpoch, UserError


@dataclass
class DeviceImages:
    padded: torch.Tensor  # uint8 N×(SIZE+2·PAD)×(SIZE+2·PAD)×3: channels last, as the files hold them
    labels: torch.Tensor  # int64 N

    def __len__(self) -> int:
        return len(self.labels)


def to_device(images: np.ndarray, labels, device: torch.device) -> DeviceImages:
    """uint8 N×SIZE×SIZE×3 images and their labels on `device`, padded once for all the crops to come."""
    padded = F.pad(torch.from_numpy(images).to(device), (0, 0, PAD, PAD, PAD, PAD))  # zeros: RandomCrop's fill
    return DeviceImages(padded, torch.as_tensor(labels, dtype=torch.int64).to(device))


def random_crops(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For n images: the crop's row and column offsets in the padded image, each uniform in 0..2·PAD, and whether to flip."""
    device = generator.device
    dy = torch.randint(0, 2 * PAD + 1, (n,), generator=generator, device=device)
    dx = torch.randint(0, 2 * PAD + 1, (n,), generator=generator, device=device)
    flip = torch.rand(n, generator=generator, device=device) < 0.5
    return dy, dx, flip


def crop_flip(
    padded: torch.Tensor, index: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, flip: torch.Tensor
) -> torch.Tensor:
    """Images `index` of `padded`, each cropped at its (dy, dx) and mirrored where `flip`: one gather, uint8 B×SIZE×SIZE×3."""
    steps = torch.arange(SIZE, device=padded.device)
    rows, cols = dy[:, None] + steps, dx[:, None] + steps  # B×SIZE each
    cols = torch.where(
        flip[:, None], cols.flip(1), cols
    )  # mirrors the crop, not the padded image: the transforms' order
    return padded[index[:, None, None], rows[:, :, None], cols[:, None, :]]


def normalize(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 B×H×W×3 → float B×3×H×W, channels last in memory, as ToTensor then Normalize: (x/255 - mean) / std."""
    return (images.permute(0, 3, 1, 2).float() / 255 - mean) / std


class DeviceBatches(ResumableEpoch):
    """One process's batches of one split, made on the device where its images are.

    Lightning hands an iterable that is not a DataLoader to the loop untouched (it injects no DistributedSampler)
    and, at each epoch's start, calls `set_epoch` on its `sampler` as on a DataLoader's.
    """

    batch_sampler = (
        None  # Lightning reads it wherever it finds a `sampler`; batches are cut here, not by a batch sampler
    )

    def __init__(self, images: DeviceImages, batch_size: int, sampler: DistributedSampler, train: bool):
        """train: augmented batches, full ones only (every rank takes the same number of steps); else the images as they are."""
        self.images, self.batch_size, self.sampler, self.train = images, batch_size, sampler, train
        # made once: a tensor built from host values per batch would wait for the GPU each step
        self.mean = torch.tensor(MEAN, device=images.padded.device).view(1, 3, 1, 1)
        self.std = torch.tensor(STD, device=images.padded.device).view(1, 3, 1, 1)

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.train else -(-n // self.batch_size)

    def __iter__(self):
        return self._epoch(self._batches) if self.train else self._batches(0)

    def _batches(self, skip: int):
        """This epoch's batches from batch `skip` on (resuming mid-epoch: the same crops, from where it stopped)."""
        device = self.images.padded.device
        index = torch.tensor(list(self.sampler), device=device)  # this epoch's share: one copy per epoch
        if self.train:
            # other crops each epoch and on each rank; a tuple of ints hashes the same in every process
            seed = hash((self.sampler.seed, self.sampler.epoch, self.sampler.rank))
            dy, dx, flip = random_crops(len(index), torch.Generator(device=device).manual_seed(seed))
        else:  # the crop at (PAD, PAD) of the padded image is the image itself
            dy = dx = torch.full_like(index, PAD)
            flip = torch.zeros_like(index, dtype=torch.bool)
        for start in range(skip * self.batch_size, len(self) * self.batch_size, self.batch_size):
            b = slice(start, start + self.batch_size)
            crops = crop_flip(self.images.padded, index[b], dy[b], dx[b], flip[b])
            yield normalize(crops, self.mean, self.std), self.images.labels[index[b]]


class DeviceCIFAR10DataModule(CIFAR10Base):
    """CIFAR-10 on each process's training device, augmented there per batch (see the module's docstring)."""

    def setup(self, stage: str) -> None:
        # this process's device is known once the trainer is set up; without a trainer: the CPU
        self.device = self.trainer.strategy.root_device if self.trainer else torch.device("cpu")
        super().setup(stage)

    def _subset(self, files: CIFAR10Files, indices: list[int] | None, augment: bool) -> DeviceImages:
        # `augment` is for the batches to decide: the images on the device are the same either way
        take = slice(None) if indices is None else indices
        return to_device(files.data[take], np.asarray(files.targets)[take], self.device)

    def _loader(self, images: DeviceImages, train: bool) -> DeviceBatches:
        sampler = self.sampler(range(len(images)), train)
        batches = DeviceBatches(images, self.batch_size, sampler, train)
        if train and len(batches) == 0:
            raise UserError(
                f"data.batch_size={self.batch_size} is more than the {len(sampler)} training images of each of "
                f"{sampler.num_replicas} processes; lower it"
            )
        return batches
