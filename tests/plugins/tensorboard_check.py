"""A check for the tests, added as `trainer.callbacks+=tensorboard_check.EventsOnS3Already` (folder on PYTHONPATH)."""

import fsspec
import pytorch_lightning as pl


class EventsOnS3Already(pl.Callback):
    """At the second epoch's start, TensorBoard's event file must already hold data on S3: written during
    training, not copied at the end."""

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == 1 and trainer.is_global_zero:
            fs, root = fsspec.core.url_to_fs(trainer.logger.log_dir)
            sizes = [fs.size(path) for path in fs.find(root) if "events.out.tfevents" in path]
            if not any(sizes):
                raise RuntimeError(f"no TensorBoard events under {trainer.logger.log_dir} after the first epoch")
