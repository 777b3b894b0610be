"""Where a location is: a URL of a store (s3://, any fsspec protocol) or a path of this machine, and which paths are
inside it. The one local/remote predicate every room asks (checkpoints, the settings' checks, restarts, tracking).
No torch.

    python -c "from sagemaker_lightning.toolbox.location import inside; print(inside('ckpts/../x', 'ckpts'))"
"""

import os
import posixpath

LOCAL = (None, "file", "local")  # fsspec's protocols of this machine's files


def remote(path: str) -> bool:
    """Whether `path` is a URL (s3://bucket/key; file:///x too), which fsspec opens, not a path of this machine, which
    os opens: the one rule, so that a location takes one road everywhere (a file:// URL is fsspec's local files)."""
    return "://" in path


def inside(path: str, dirpath: str) -> bool:
    """Whether `path` names something in `dirpath` (each a path or an fsspec URL), not `dirpath` itself: local paths
    resolved (`..`, symbolic links), a URL's protocol and bucket/key compared once normalised."""
    from fsspec.core import split_protocol

    (protocol, where), (home_protocol, home) = (split_protocol(str(p)) for p in (path, dirpath))
    local = protocol in LOCAL
    if not path or local != (home_protocol in LOCAL) or (not local and protocol != home_protocol):
        return False
    if local:
        where, home = os.path.realpath(where), os.path.realpath(home)
    else:
        where, home = posixpath.normpath(f"/{where}"), posixpath.normpath(f"/{home}")
    return where != home and posixpath.commonpath([where, home]) == home
