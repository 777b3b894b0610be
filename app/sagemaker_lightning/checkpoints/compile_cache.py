"""torch.compile's cache beside the checkpoints: a job compiles once, not once per restart.

torch.compile records what it compiles (Inductor's kernels and graphs, AOTAutograd's, its autotuning) as portable
cache artifacts (torch.compiler.save_cache_artifacts). Whenever a checkpoint is saved, rank 0 writes those it has to
FILE in the checkpoint directory, which SageMaker uploads with the checkpoints and restores on a restarted (spot)
job; before the first step of a fit every rank loads FILE when it is there (load_cache_artifacts), so the restarted
job finds its kernels compiled. FILE's first line names the torch that wrote it: torch uses no artifact of another
version. A cache that cannot be read, or that another torch wrote, costs one line and a compile, never the job.

FILE is rewritten only with more: when the artifacts torch holds now name every artifact FILE holds (loaded from it,
or written to it last) and at least one more. Artifacts are compared by (type, key) as torch's CacheInfo names them,
the key being the cache's own key of what was compiled, not by their bytes' length: a restart records only the
artifacts it uses (a hit in the caches FILE filled records it again), so before it has run every graph the first run
compiled, its artifacts are fewer than FILE's, and writing them used to lose the rest; artifacts of the same length
but other keys were never written. Until a restart's artifacts cover FILE's, its new ones wait for the next save.

The artifacts hold the code torch.compile generated, and torch runs it: whoever can write the checkpoint location can
run code in a job that loads FILE, as through the image or the job's own code. So FILE is loaded only where the
model compiles something already (model.compile: a module compiled in place or wrapped by torch.compile), and
`compile_cache=false` (a runtime setting) saves and loads none, for a checkpoint location that others can write
(README: Security). A model that compiles nothing never reads FILE: its checkpoints still run nothing.

    python app/example/train.py --model.compile true --checkpoint.dirpath ckpts    # ckpts/compile_cache.bin
"""

import contextlib
import logging

import fsspec
import torch

from sagemaker_lightning.checkpoints import atomic
from sagemaker_lightning.lines import say

FILE = "compile_cache.bin"  # in checkpoint.dirpath; not a checkpoint (resume.names takes *.ckpt only)


def header() -> bytes:
    return f"torch {torch.__version__}\n".encode()


def artifacts(data: bytes) -> bytes:
    """The artifacts in FILE's content `data`; ValueError naming why torch cannot use them."""
    first, _, rest = data.partition(b"\n")
    if not first.startswith(b"torch "):
        raise ValueError("not a compile cache of the runtime's")
    if first + b"\n" != header():
        raise ValueError(f"written by {first.decode(errors='replace')}, and this is torch {torch.__version__}")
    return rest


def names(info) -> frozenset[tuple[str, str]]:
    """The artifacts a torch CacheInfo names, as (type, key) pairs."""
    return frozenset((kind, key) for kind, keys in info.artifacts.items() for key in keys)


def compiles(module) -> bool:
    """Whether `module` runs any of its modules through torch.compile: compiled in place (Module.compile), wrapped
    (torch.compile(module)), or handed to Lightning wrapped (its _compiler_ctx)."""
    wrapped = torch._dynamo.eval_frame.OptimizedModule
    if getattr(module, "_compiler_ctx", None):
        return True
    return any(isinstance(m, wrapped) or getattr(m, "_compiled_call_impl", None) is not None for m in module.modules())


@contextlib.contextmanager
def quiet(name: str = "torch.compiler._cache"):
    """torch logs an unreadable cache with its traceback: the runtime's one line says it instead."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


class CompileCache:
    """Loads FILE from the ModelCheckpoint's directory before a fit's first step, where the model compiles; saves
    torch.compile's artifacts there with each checkpoint, when there are new ones."""

    BASE = "callbacks.Callback"

    def __init__(self, checkpoint):
        self.checkpoint = checkpoint  # its dirpath, once set up, holds the checkpoints and FILE
        self._held: frozenset[tuple[str, str]] = frozenset()  # the artifacts FILE holds: loaded, or written last

    def _path(self) -> str | None:
        return f"{self.checkpoint.dirpath.rstrip('/')}/{FILE}" if self.checkpoint.dirpath else None

    def setup(self, trainer, pl_module, stage):
        path = self._path()
        if stage != "fit" or path is None or not compiles(pl_module):
            return
        fs, where = fsspec.core.url_to_fs(path)
        if not fs.exists(where):
            return
        try:
            with fs.open(where, "rb") as f:
                data = artifacts(f.read())
            with quiet():
                info = torch.compiler.load_cache_artifacts(data)
            if info is None:
                raise ValueError("torch could not read it")
        except Exception as e:  # whatever the file holds: the job compiles afresh
            if trainer.is_global_zero:
                why = " ".join(f"{type(e).__name__}: {e}".split())[:300]
                say(f"compile cache {FILE} not used ({why}): torch.compile compiles afresh")
            return
        self._held = names(info)
        if trainer.is_global_zero:
            count = sum(len(keys) for keys in info.artifacts.values())
            say(f"compile cache: loaded {count} artifacts ({len(data) / 2**20:.1f} MiB) from {FILE}, saved by an "
                "earlier run of this job")  # fmt: skip

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        path = self._path()
        if not trainer.is_global_zero or path is None:
            return
        saved = torch.compiler.save_cache_artifacts()
        if saved is None or not names(saved[1]) > self._held:  # nothing compiled, nothing new, or fewer than FILE's
            return
        atomic.write(path, header() + saved[0])
        if not self._held:
            say(f"compile cache: saved {FILE} ({len(saved[0]) / 2**20:.1f} MiB) beside the checkpoints, for a restart")
        self._held = names(saved[1])
