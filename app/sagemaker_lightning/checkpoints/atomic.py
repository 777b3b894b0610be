"""How every checkpoint and model file is written: atomically.

New content goes to a hidden partial name beside its path and is renamed to the path once complete (`replacing`), so
a kill during a write never leaves a broken file under the real name, and resume never takes a partial one for a
checkpoint (hidden names are not checkpoints: resume.names); one a kill left is removed at the next start
(clear_partials). Every writer uses it: last.ckpt and the best checkpoints (writer.py), the previous save's link
(retention.keep_previous), a sharded save's meta.pt (sharded_writer.py), model.pt and config.yaml (export.py), small
files such as the compile cache and the MLflow run's record (`write`). Which saves stay is retention.py's rule.

    python -c "from sagemaker_lightning.checkpoints import atomic; print(atomic.partial_path('ckpts/last.ckpt'))"
"""

import contextlib
import os

import fsspec

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
