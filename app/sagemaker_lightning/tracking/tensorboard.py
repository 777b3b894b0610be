"""The trainer's logger, where the project names none: TensorBoard, as Lightning's default is, with the runtime's
`logger` settings (cli/settings.py adds them: `logger.save_dir`, which on SageMaker is under SM_OUTPUT_DATA_DIR, so
that the logs land in output.tar.gz, and TensorBoardLogger's own arguments).

    python app/example/train.py fit --help | grep -A1 -- --logger.save_dir
"""

import os

from sagemaker_lightning.toolbox import lightning_package
from sagemaker_lightning.toolbox.concern import Context, Part


def concern(ctx: Context) -> Part:
    """The trainer's logger: TensorBoard with the `logger` settings, under logger.save_dir, else trainer.default_root_dir
    (as Lightning's default is), unless trainer.logger names another or is false."""
    if ctx.trainer.get("logger") not in (None, True):
        return Part()
    kept = ctx.init["logger"].as_dict()
    root = kept.pop("save_dir") or ctx.trainer.get("default_root_dir") or os.getcwd()
    return Part(arguments={"logger": lightning_package.attribute(ctx.pl, "loggers.TensorBoardLogger")(root, **kept)})
