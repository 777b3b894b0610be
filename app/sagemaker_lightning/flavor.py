"""Lightning comes as two packages with separate class hierarchies: `lightning` (imported as `lightning.pytorch`)
and `pytorch_lightning`. A `lightning.pytorch.LightningModule` is refused by a `pytorch_lightning.Trainer`, and a
callback of one package is ignored by the other's trainer. The runtime's callbacks and plugins are written once, as
mixins, and made into classes of the package the user's project imports (the image carries both, at one version).

    python -c "from sagemaker_lightning import flavor; print(flavor.package().__name__)"
"""

import functools
import importlib
import sys
from types import ModuleType

PACKAGES = ("lightning.pytorch", "pytorch_lightning")  # in the order of preference when nothing tells them apart


def package(*classes) -> ModuleType:
    """The Lightning package of the first of `classes` built on one (their base classes tell), else the one the
    project has imported, else the first installed of PACKAGES."""
    for cls in classes:
        for base in getattr(cls, "__mro__", ()):
            for name in PACKAGES:
                if base.__module__ == name or base.__module__.startswith(name + "."):
                    return importlib.import_module(name)
    for name in PACKAGES:
        if name in sys.modules:
            return sys.modules[name]
    for name in PACKAGES:
        try:
            return importlib.import_module(name)
        except ImportError:
            pass
    raise ImportError("neither lightning nor pytorch_lightning is installed; pip install lightning")


def attribute(pl: ModuleType, path: str):
    """`pl` + a dotted path, e.g. attribute(pl, "callbacks.Callback"), importing submodules as needed."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(f"{pl.__name__}.{module}") if module else pl, name)


@functools.cache
def made(mixin: type, pl: ModuleType) -> type:
    """`mixin` as a subclass of the class its BASE names in package `pl`; `pl` is its class attribute."""
    base = attribute(pl, mixin.BASE)
    return type(mixin.__name__, (mixin, base), {"pl": pl, "__module__": mixin.__module__, "__doc__": mixin.__doc__})
