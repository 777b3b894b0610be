"""A callback that logs a metric averaged across ranks (Lightning's sync_dist mean): the control that the
smddp stand-in catches averaging."""

import pytorch_lightning as pl


class LogMeanLoss(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pl_module.log("train/mean_loss", outputs["loss"], sync_dist=True)
