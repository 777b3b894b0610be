"""The project's model: a small network that tells which of three clusters a 2-D point belongs to.

python -c "import classifier; print(classifier.Classifier())"
"""

import time

import lightning.pytorch as L
import torch
from torch import nn


class Classifier(L.LightningModule):
    def __init__(self, hidden: int = 16, lr: float = 0.1, step_seconds: float = 0.0, compile: bool = False):
        """
        Args:
            hidden: units of the hidden layer.
            lr: learning rate of SGD.
            step_seconds: a pause in every training step (the project's tests stop a job while it trains).
            compile: run the network through torch.compile (its first steps compile it).
        """
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, 3))
        if compile:  # in place: the weights keep their names
            self.net.compile()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        time.sleep(self.hparams.step_seconds)
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        accuracy = (self(x).argmax(1) == y).float().mean()
        self.log("val/acc", accuracy, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
