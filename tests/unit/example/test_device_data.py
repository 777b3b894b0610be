"""The device-resident data path against the DataLoader path: same crops, flips and normalization, same sharding."""

import pickle

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
import torchvision.transforms.functional as TF
from torch.utils.data import DistributedSampler

import make_dataset
from data import MEAN, PAD, SIZE, STD, CIFAR10DataModule
from device_data import DeviceBatches, DeviceCIFAR10DataModule, DeviceImages, crop_flip, normalize, to_device
from sagemaker_lightning import UserError

pytestmark = pytest.mark.unit

EPOCHS = 24  # passes over the training images per path in the statistical tests


def modules(data_dir, batch_size=16) -> tuple[CIFAR10DataModule, DeviceCIFAR10DataModule]:
    """Both pipelines on the same files, all images for training (no trainer: the device is the CPU)."""
    cpu = CIFAR10DataModule(data_dir, batch_size=batch_size, num_workers=0, val_split=0)
    device = DeviceCIFAR10DataModule(data_dir, batch_size=batch_size, val_split=0)
    for dm in (cpu, device):
        dm.setup("fit")
    return cpu, device


def dataloader_samples(dm: CIFAR10DataModule, epochs: int) -> torch.Tensor:
    return torch.stack([dm.train_set[epoch, i][0] for epoch in range(epochs) for i in range(len(dm.train_set))])


def device_samples(dm: DeviceCIFAR10DataModule, epochs: int) -> torch.Tensor:
    batches = dm.train_dataloader()
    out = []
    for epoch in range(epochs):
        batches.sampler.set_epoch(epoch)  # what Lightning's fit loop does at each epoch's start
        out += [x for x, _ in batches]
    return torch.cat(out)


@pytest.fixture(scope="module")
def coded_dir(tmp_path_factory) -> str:
    """64 copies of one image whose pixels tell where they come from: red = 64 + 4·row, green = 64 + 4·column."""
    rows, cols = np.mgrid[0:SIZE, 0:SIZE]
    image = np.stack([64 + 4 * rows, 64 + 4 * cols, np.full_like(rows, 128)]).astype(np.uint8)  # 3×32×32, as CIFAR
    data = np.repeat(image.reshape(1, -1), 64, axis=0)
    out = str(tmp_path_factory.mktemp("coded"))
    files = {
        f"data_batch_{i}": make_dataset.batch(f"data_batch_{i}", data[i - 1 :: 5], [0] * len(data[i - 1 :: 5]))
        for i in range(1, 6)
    }
    files["test_batch"] = make_dataset.batch("test_batch", data[:4], [0] * 4)
    files["batches.meta"] = pickle.dumps({"label_names": make_dataset.CLASSES})
    make_dataset.write_archive(out, files)
    return out


def crop_parameters(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row and column offsets in the padded image, and flips, read back from crops of the coded image."""
    pixels = torch.round((x * torch.tensor(STD).view(1, 3, 1, 1) + torch.tensor(MEAN).view(1, 3, 1, 1)) * 255)
    centre = SIZE // 2  # always inside the image: no offset reaches it with padding
    flip = pixels[:, 1, centre, centre + 1] < pixels[:, 1, centre, centre]  # columns run backwards
    source_row = (pixels[:, 0, centre, centre] - 64) / 4
    source_col = (pixels[:, 1, centre, centre] - 64) / 4
    # output (r, c) shows padded (r + dy, c + dx), or (r + dy, SIZE-1 - c + dx) when flipped; the image starts at PAD
    dy = source_row - centre + PAD
    dx = torch.where(flip, source_col - (SIZE - 1 - centre) + PAD, source_col - centre + PAD)
    return dy.long(), dx.long(), flip


def test_crops_equal_torchvisions_for_the_same_offsets(archive_dir):
    """Given the offsets and flips, the device path computes exactly what the transforms compute on PIL images."""
    cpu, device = modules(archive_dir)
    pil = cpu.train_set.images.data  # the raw images, N×32×32×3
    index = torch.tensor([0, 1, 2, 3, 4, 5])
    dy, dx, flip = (
        torch.tensor([0, 8, 4, 8, 0, 3]),
        torch.tensor([0, 8, 4, 0, 8, 5]),
        torch.tensor([False, True, False, True, False, True]),
    )
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    ours = normalize(crop_flip(device.train_set.padded, index, dy, dx, flip), mean, std)
    for k, i in enumerate(index.tolist()):
        image = TF.crop(TF.pad(TF.to_pil_image(pil[i]), PAD), int(dy[k]), int(dx[k]), SIZE, SIZE)
        image = TF.hflip(image) if flip[k] else image
        expected = TF.normalize(TF.to_tensor(image), MEAN, STD)
        torch.testing.assert_close(ours[k], expected, rtol=0, atol=1e-6)


def test_crop_offsets_and_flips_are_distributed_as_the_transforms_draw_them(coded_dir):
    cpu, device = modules(coded_dir)
    for name, x in (("DataLoader", dataloader_samples(cpu, EPOCHS)), ("device", device_samples(device, EPOCHS))):
        dy, dx, flip = crop_parameters(x)
        n = len(x)
        for offsets in (dy, dx):  # each of 0..2·PAD equally often (1/9); 5 standard errors of slack at n = 1536
            frequencies = torch.bincount(offsets, minlength=2 * PAD + 1).float() / n
            assert len(frequencies) == 2 * PAD + 1, f"{name}: offsets beyond 0..{2 * PAD}"
            assert (frequencies - 1 / (2 * PAD + 1)).abs().max() < 0.04, f"{name}: {frequencies}"
        assert abs(flip.float().mean() - 0.5) < 0.065, name
        assert torch.corrcoef(torch.stack([dy.float(), dx.float(), flip.float()])).triu(1).abs().max() < 0.1, name


@pytest.mark.parametrize("images", ["archive_dir", "coded_dir"])
def test_per_pixel_statistics_match_the_dataloader_path(images, request):
    """Over the same images, augmented many times, each pixel's mean and spread agree between the paths."""
    cpu, device = modules(request.getfixturevalue(images))
    a, b = dataloader_samples(cpu, EPOCHS), device_samples(device, EPOCHS)
    assert a.shape == b.shape and len(a) == EPOCHS * len(cpu.train_set)
    for statistic in (torch.mean, torch.std):
        difference = (statistic(a, 0) - statistic(b, 0)).abs()
        # sampling noise alone: under 0.02 on average and 0.08 at most here; on the coded images, no flips, flips
        # with probability 0.35 or offsets 0..7 instead of 0..8 exceed these bounds
        assert difference.mean() < 0.025 and difference.max() < 0.15, statistic.__name__


def test_evaluation_batches_are_the_dataloader_paths_images(archive_dir):
    cpu = CIFAR10DataModule(archive_dir, batch_size=16, num_workers=0, val_split=40)
    device = DeviceCIFAR10DataModule(archive_dir, batch_size=16, val_split=40)
    for dm in (cpu, device):
        dm.setup("fit")
    expected = list(cpu.val_dataloader())
    got = list(device.val_dataloader())
    assert [len(y) for _, y in got] == [16, 16, 8]  # every image once, the last batch short
    torch.testing.assert_close(torch.cat([x for x, _ in got]), torch.cat([x for x, _ in expected]), rtol=0, atol=1e-6)
    assert torch.equal(torch.cat([y for _, y in got]), torch.cat([y for _, y in expected]))


def ranks(n: int, world_size: int, batch_size: int, epoch: int) -> list[list[int]]:
    """The image indices each rank trains on in one epoch (labels set to the indices make them visible)."""
    images = DeviceImages(torch.zeros(n, SIZE + 2 * PAD, SIZE + 2 * PAD, 3, dtype=torch.uint8), torch.arange(n))
    shares = []
    for rank in range(world_size):
        batches = DeviceBatches(
            images, batch_size, DistributedSampler(range(n), world_size, rank, seed=7, drop_last=True), train=True
        )
        batches.sampler.set_epoch(epoch)
        shares.append([i for _, y in batches for i in y.tolist()])
    return shares


def test_ranks_take_disjoint_equal_shares_of_one_permutation():
    shares = ranks(n=103, world_size=3, batch_size=8, epoch=0)
    assert [len(s) for s in shares] == [32, 32, 32]  # 34 images per rank, 4 full batches, every rank the same
    assert len(set().union(*shares)) == 96  # no image on two ranks
    assert ranks(103, 3, 8, epoch=0) == shares  # every process computes the same permutation
    assert ranks(103, 3, 8, epoch=1) != shares  # and another one each epoch


def test_lightning_passes_the_batches_through_and_sets_the_epoch(archive_dir, tmp_path):
    """A real Trainer: batches arrive as made, on the module's device; each epoch brings another order."""

    class Record(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))
            self.orders: dict[int, list[int]] = {}

        def training_step(self, batch, batch_idx):
            x, y = batch
            assert x.shape == (16, 3, SIZE, SIZE) and x.dtype == torch.float32
            self.orders.setdefault(self.current_epoch, []).extend(y.tolist())
            return (self.weight * x.mean()).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    dm = DeviceCIFAR10DataModule(archive_dir, batch_size=16, val_split=0)
    module = Record()
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, dm)
    assert sorted(module.orders) == [0, 1] and len(module.orders[0]) == len(module.orders[1]) == 160
    assert module.orders[0] != module.orders[1]  # labels in another order: a new permutation


def test_batch_larger_than_a_ranks_share_is_a_user_error(archive_dir):
    dm = DeviceCIFAR10DataModule(archive_dir, batch_size=500, val_split=0)
    dm.setup("fit")
    with pytest.raises(
        UserError, match="data.batch_size=500 is more than the 160 training images of each of 1 processes"
    ):
        dm.train_dataloader()


def test_images_are_padded_with_black_once():
    images = np.full((2, SIZE, SIZE, 3), 200, dtype=np.uint8)
    on_device = to_device(images, [3, 4], torch.device("cpu"))
    assert on_device.padded.shape == (2, SIZE + 2 * PAD, SIZE + 2 * PAD, 3) and on_device.labels.tolist() == [3, 4]
    assert on_device.padded[:, :PAD].eq(0).all() and on_device.padded[:, PAD:-PAD, PAD:-PAD].eq(200).all()
