"""A user's own Lightning project, not the example (written for `lightning.pytorch`): its data, points in the
plane from three clusters, read from `points.pt` in a directory argument named `root` (not data_dir).

    python -c "import points; points.write_points('/tmp/points')"   # the data file the tests give as a channel
"""

import os

import lightning.pytorch as L
import torch
from torch.utils.data import DataLoader, TensorDataset


def write_points(root: str, n: int = 512, seed: int = 0) -> str:
    """Three Gaussian clusters in the plane, labelled by cluster."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (n,), generator=generator)
    centres = torch.tensor([[-2.0, 0.0], [2.0, 0.0], [0.0, 3.0]])
    points = centres[labels] + 0.5 * torch.randn(n, 2, generator=generator)
    os.makedirs(root, exist_ok=True)
    torch.save({"points": points, "labels": labels}, os.path.join(root, "points.pt"))
    return root


class Points(L.LightningDataModule):
    def __init__(self, root: str = "data/points", batch_size: int = 32):
        """
        Args:
            root: directory with points.pt.
            batch_size: points per batch.
        """
        super().__init__()
        self.root, self.batch_size = root, batch_size

    def setup(self, stage: str) -> None:
        data = torch.load(os.path.join(self.root, "points.pt"))
        dataset = TensorDataset(data["points"], data["labels"])
        self.train, self.val = torch.utils.data.random_split(dataset, [0.75, 0.25], torch.Generator().manual_seed(0))

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True, drop_last=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=self.batch_size)
