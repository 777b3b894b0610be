"""The one-line way: this project's LightningCLI script, with Lightning's import replaced by the runtime's.

python train.py fit --data.root data/points --trainer.max_epochs 2
"""

from classifier import Classifier
from points import Points

from sagemaker_lightning import LightningCLI  # was: from lightning.pytorch.cli import LightningCLI

if __name__ == "__main__":
    LightningCLI(Classifier, Points, data_channels={"training": "root"})
