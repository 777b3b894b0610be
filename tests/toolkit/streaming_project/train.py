"""A user's project that streams its data from S3 with its own litdata StreamingDataLoader, as litdata's docs build
one (in setup, shuffled), and whose configure_optimizers asks for trainer.estimated_stepping_batches (a schedule over
the run, Lightning issue 20550). Every sample carries its id; each rank prints the ids of each step and each epoch's
end, which tests/toolkit/test_streaming_toolkit.py compares across a chain of stops and restarts.

    python train.py fit --data.data_dir s3://bucket/ids --trainer.max_epochs 3
"""

import lightning.pytorch as pl
import torch
from litdata import StreamingDataLoader, StreamingDataset
from torch.nn import functional as F

from sagemaker_lightning import LightningCLI


class Ids(pl.LightningDataModule):
    def __init__(self, data_dir: str = "", batch_size: int = 8, num_workers: int = 0):
        super().__init__()
        self.data_dir, self.batch_size, self.num_workers = data_dir, batch_size, num_workers

    def setup(self, stage: str) -> None:
        self.train = StreamingDataset(self.data_dir, shuffle=True, seed=7)

    def train_dataloader(self):
        return StreamingDataLoader(self.train, batch_size=self.batch_size, num_workers=self.num_workers)


class Tiny(pl.LightningModule):
    """A linear classifier with dropout (random numbers each step) and momentum (optimizer state)."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Dropout(0.2), torch.nn.Linear(16, 4))

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch["x"]), batch["y"])

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        total = self.trainer.estimated_stepping_batches  # sets the data up before a resume's restore
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / (total + 1))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class PrintIds(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        ids = ",".join(str(int(i)) for i in batch["id"])
        print(
            f"ids rank {trainer.global_rank} epoch {trainer.current_epoch} step {trainer.global_step}: {ids}",
            flush=True,
        )

    def on_train_epoch_end(self, trainer, pl_module):
        print(
            f"epoch end rank {trainer.global_rank} epoch {trainer.current_epoch} step {trainer.global_step}", flush=True
        )


if __name__ == "__main__":
    LightningCLI(Tiny, Ids, trainer_defaults={"callbacks": [PrintIds()]})
