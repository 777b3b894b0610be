"""Lightning comes as two packages with separate class hierarchies: `lightning` (imported as `lightning.pytorch`)
and `pytorch_lightning`. A `lightning.pytorch.LightningModule` is refused by a `pytorch_lightning.Trainer`, and a
callback of one package is ignored by the other's trainer. The runtime's callbacks and plugins are written once, as
mixins, and made into classes of the package the user's project imports (the image carries both, at one version).

    python -c "from sagemaker_lightning.toolbox import lightning_package; print(lightning_package.package().__name__)"
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


# Callback hooks that Lightning calls directly, not through _call_callback_hooks' `if callable(fn)`
CALLED_DIRECTLY = ("on_save_checkpoint", "on_load_checkpoint")


@functools.cache
def made(mixin: type, pl: ModuleType) -> type:
    """`mixin` as a subclass of the class its BASE names in package `pl`; `pl` is its class attribute. A callback's
    hooks that `mixin` leaves out are None, which Lightning skips: it calls each hook of each callback at every step,
    even the base class's empty ones, and each call costs about 2 µs (the profiler's context, the hook's name built):
    with the runtime's 5 callbacks and 6 hooks a step, 60 µs of a 1.3 ms step on 2 AMD EPYC cores
    (scripts/bench_overhead.py)."""
    base = attribute(pl, mixin.BASE)
    namespace = {"pl": pl, "__module__": mixin.__module__, "__qualname__": mixin.__qualname__, "__doc__": mixin.__doc__}
    namespace["__reduce__"] = _reduce
    if issubclass(base, attribute(pl, "callbacks.Callback")):
        skipped = (n for n in dir(base) if n.startswith("on_") and n not in CALLED_DIRECTLY and not hasattr(mixin, n))
        namespace.update(dict.fromkeys(skipped))
    return type(mixin.__name__, (mixin, base), namespace)


def _reduce(self):
    """Pickle an instance of a made class as (mixin, package) and its state: pickle finds a class by its module and
    name, which lead to the mixin, not to the class made of it (strategy="ddp_spawn" pickles the trainer's strategy
    and callbacks, and what holds the CLI, into each new process). The mixin is the class it was made from, a
    project's own subclass of the runtime's LightningCLI included."""
    return _rebuilt, (type(self).__mro__[1], self.pl.__name__), self.__getstate__()


def _rebuilt(mixin: type, package_name: str):
    return object.__new__(made(mixin, importlib.import_module(package_name)))  # not its __new__: the CLI's makes one
