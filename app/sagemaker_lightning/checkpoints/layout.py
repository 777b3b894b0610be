"""checkpoint.dirpath's layout and model_dir's: the names of what the runtime writes there, each written here only,
and that a save writes and deletes nowhere else (`unlinked`). No torch.

    python -c "from sagemaker_lightning.checkpoints import layout; print(layout.LAST, layout.PREVIOUS)"
"""

import os

from sagemaker_lightning.failure import UserError
from sagemaker_lightning.toolbox.concern import Setting

# checkpoint.dirpath's layout
LAST = "last.ckpt"  # the newest save (a file; with fsdp a folder of saves: sharded_saves.py), the one resumed from
PREVIOUS = "last-previous.ckpt"  # last.ckpt's predecessor, kept while last.ckpt is replaced and uploaded (retention.py)
META = "meta.pt"  # in a sharded save: Lightning's name for its non-tensor part (loops, callbacks)
METADATA = ".metadata"  # in a sharded save: DCP's index of the shards, written last (rank 0's, after every shard)
# model_dir's layout: the trained model after fit (export.py), which SageMaker packs into model.tar.gz
MODEL_DIR = Setting("model_dir", str | None, None, "where rank 0 writes model.pt and config.yaml after fit")
MODEL, CONFIG = "model.pt", "config.yaml"  # the weights (written last: its presence means complete), the configuration


def sharding(strategy) -> bool:
    """Whether `strategy` (an object, or a name) saves last.ckpt as a folder of shards: it offers sharded_state(), the
    context its saves are sharded in, and full_state_dict(module), the weights gathered (parallel/fsdp.py's does)."""
    return hasattr(strategy, "sharded_state")


def unlinked(path: str, dirpath: str) -> None:
    """Raises UserError unless `path` is a local path inside `dirpath` (checkpoint.dirpath, or a folder inside it)
    with no symbolic link from there down to it: what a save writes to or prunes is then inside dirpath, wherever
    a link there would point (a shared volume can hold one: a PVC, NFS, FSx). dirpath itself is the user's setting
    and may be a link; `..` is resolved before the comparison."""
    home, where = os.path.abspath(dirpath), os.path.abspath(path)
    if where != home and not where.startswith(home.rstrip(os.sep) + os.sep):
        raise UserError(f"{path} is outside checkpoint.dirpath {dirpath}: a save writes and deletes nowhere else")
    here = home
    for part in os.path.relpath(where, home).split(os.sep) if where != home else []:
        here = os.path.join(here, part)
        if os.path.islink(here):
            raise UserError(
                f"{here} is a symbolic link (to {os.readlink(here)}): checkpoints are written and deleted only inside "
                f"checkpoint.dirpath {dirpath}, never through a link; remove the link (what it names stays as it is), "
                "or set checkpoint.dirpath to the folder itself"
            )
