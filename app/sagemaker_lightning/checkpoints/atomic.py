"""How every checkpoint and model file is written, and which saves are kept: atomically, and with the previous save
kept by one rule.

The atomic write: new content goes to a hidden partial name beside its path and is renamed to the path once complete
(`replacing`), so a kill during a write never leaves a broken file under the real name, and resume never takes a
partial one for a checkpoint (hidden names are not checkpoints: resume.names); one a kill left is removed at the next
start (clear_partials). Every writer uses it: last.ckpt and the best checkpoints (writer.py), the previous save's link
below, a sharded save's meta.pt (sharded_saves.py), model.pt and config.yaml (export.py), small files such as the
compile cache and the MLflow run's record (`write`).

The previous save: SageMaker uploads the checkpoint directory in the background and deletes in S3 what is deleted
here, so the newest save is never the only complete one while the next is written and uploaded. A single-file
last.ckpt is linked as PREVIOUS just before the new one is renamed over it (keep_previous, from writer.py); sharded
saves go to a new folder each, and once one is complete every folder but it and the complete one before it is removed
(prune). Neither follows a symbolic link there (location.unlinked): a link is refused in one line before anything is
linked or removed.

    python -c "from sagemaker_lightning.checkpoints import atomic; print(atomic.partial_path('ckpts/last.ckpt'))"
"""

import contextlib
import os
import shutil

import fsspec

from sagemaker_lightning.checkpoints.layout import PREVIOUS, unlinked
from sagemaker_lightning.toolbox.location import remote


def partial_path(path: str) -> str:
    """Where a file is written before it is renamed to `path`: hidden, so that resume never takes it for a checkpoint."""
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.partial")


@contextlib.contextmanager
def replacing(path: str):
    """Yields the partial name to write `path`'s new content to; renamed to `path` when the block ends, removed when
    it fails. A partial file a kill left behind is removed first. Nested, the innermost is renamed first."""
    partial = partial_path(path)
    if os.path.lexists(partial):
        os.remove(partial)
    try:
        yield partial
    except BaseException:
        if os.path.lexists(partial):
            os.remove(partial)
        raise
    os.replace(partial, path)


def clear_partials(dirpath: str) -> None:
    """Remove the partial files writes cut short by a kill left in `dirpath` (a local folder), before a job writes
    there: a background write of a best checkpoint killed midway leaves one under a name no later save reuses."""
    if remote(dirpath) or not os.path.isdir(dirpath):
        return
    for name in os.listdir(dirpath):
        if name.startswith(".") and name.endswith(".partial"):
            os.remove(os.path.join(dirpath, name))  # a link of that name goes, not what it names


def write(url: str, data: bytes) -> None:
    """`data` as the file at `url` (a path or an fsspec URL), whole or not at all: written to its partial name and
    renamed here (replacing), put as one object in an object store, which writes whole objects."""
    fs, path = fsspec.core.url_to_fs(url)
    if not remote(url):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with replacing(path) as partial, open(partial, "wb") as f:
            f.write(data)
    else:
        fs.pipe(path, data)


def keep_previous(path: str) -> None:
    """last.ckpt's file (at `path`, a path or an fsspec URL) also as PREVIOUS, replacing the one before, before a new
    last.ckpt replaces it: while the new one is written, and until SageMaker's background upload of it is done, a
    complete copy of the progress stays beside it (a hard link here, a server-side copy in S3), from which the job
    resumes when last.ckpt does not load. In S3 the copy runs while the new object is uploaded, which appears only
    once the copy is done (s3_transfer.upload): a save does not wait for the two in a row."""
    fs, source = fsspec.core.url_to_fs(path)
    target = f"{source.rsplit('/', 1)[0]}/{PREVIOUS}"
    if not fs.exists(source):
        return
    if not remote(path):
        unlinked(source, os.path.dirname(source))  # os.link would link what a link names
        with replacing(target) as partial:
            os.link(source, partial)
    elif path.startswith("s3://"):
        from sagemaker_lightning.checkpoints import s3_transfer  # torch: not for this module's other callers

        s3_transfer.copy(path, f"s3://{target}")
    else:
        fs.copy(source, target)


def prune(root: str, keep: set[str]) -> None:
    """Remove every save in `root` (a sharded last.ckpt/) but those named in `keep`: the newest complete one and the
    complete one before it; saves cut short go too. Nothing is removed where root, or any entry in it, is a symbolic
    link (location.unlinked; root is in checkpoint.dirpath)."""
    dirpath = os.path.dirname(os.path.abspath(root))
    unlinked(root, dirpath)
    entries = os.listdir(root)
    for entry in entries:
        unlinked(os.path.join(root, entry), dirpath)
    for entry in entries:
        if entry not in keep:
            shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
