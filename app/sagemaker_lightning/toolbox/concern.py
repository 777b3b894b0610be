"""The one shape of a trainer concern: a function from a Context (what is known when the trainer is built) to a Part
(its callbacks, plugins and trainer arguments). The hub (hub.py) lists the concerns in order, and that list is the
callbacks' order: no concern moves itself or another. A concern declares the runtime's settings it reads beside it
(`declares`, each a Setting), and the hub adds them to its parser in the same order (cli/settings.py).

Lightning moves every checkpoint callback (ModelCheckpoint) to the end of the list, when the trainer is made and again
when the model adds callbacks of its own (configure_callbacks). What must come after them (last.ckpt, saved once the
best checkpoint is chosen; the MLflow run's end, after a stop's checkpoint) is a Part's `after_checkpoints`: the hub's
CallbackOrder puts those after every checkpoint callback, in the hub's order, when a fit sets up. A callback's work at
every training step is its step_start and step_end, which one callback (Steps) calls for all, after every other.

    python -c "from sagemaker_lightning.toolbox.concern import Part; print(Part())"
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from sagemaker_lightning.launch.plan import Plan
from sagemaker_lightning.toolbox.status import Status


@dataclass(frozen=True)
class Setting:
    """One of the runtime's settings: `--key value`, a YAML config's key or a SageMaker hyperparameter."""

    key: str
    type: Any
    default: Any
    help: str

    def of(self, config: Mapping):
        """Its value in the subcommand's resolved configuration."""
        return config[self.key]


def declares(*settings: Setting):
    """Marks a concern (a function Context → Part) with the settings it reads, for the hub's parser."""

    def marked(concern):
        concern.settings = settings
        return concern

    return marked


@dataclass(kw_only=True)
class Context:
    """What a concern is given. `arguments` grows as the hub goes down its list: a concern sees those before it."""

    pl: ModuleType  # the Lightning package of the project's classes (lightning.pytorch or pytorch_lightning)
    plan: Plan  # the launch plan, completed with the resolved trainer settings
    config: Mapping = field(default_factory=dict)  # the subcommand's resolved configuration: the runtime's settings
    init: Mapping = field(default_factory=dict)  # the same with its classes made (`fsdp`, `logger`, the checkpoint)
    trainer: Mapping = field(default_factory=dict)  # the trainer's arguments as the configuration gives them
    arguments: dict = field(default_factory=dict)  # the trainer arguments of the concerns before this one
    model: Any = None  # the LightningModule
    model_checkpoint: Any = None  # the ModelCheckpoint the runtime's checkpointing follows, or None
    config_yaml: Callable[[], str] = str  # the resolved configuration as model_dir's config.yaml holds it (redacted)
    status: Status = field(default_factory=Status)  # what the watchdog shares with the rest (toolbox/status.py)
    goodput: Any = None  # this attempt's goodput.Attempt: its ledger, which the checkpoints account their time in


@dataclass
class Part:
    """What a concern gives the trainer."""

    callbacks: list = field(default_factory=list)
    after_checkpoints: list = field(default_factory=list)  # callbacks that come after every checkpoint callback
    plugins: list = field(default_factory=list)
    arguments: dict = field(default_factory=dict)  # trainer arguments (strategy, precision, logger, ...)
    attach: Callable[[Any], None] | None = None  # called with the trainer once it exists


class CallbackOrder:
    """The hub's order after Lightning's: the concerns' `after_checkpoints` callbacks after every checkpoint callback,
    in the hub's order, at setup (the model's own callbacks have joined by then)."""

    BASE = "callbacks.Callback"

    def __init__(self, last: list):
        self.last = last

    def setup(self, trainer, pl_module, stage):
        # a new list, not an in-place move: Lightning is iterating over the old one to call this hook
        trainer.callbacks = [c for c in trainer.callbacks if all(c is not x for x in self.last)] + self.last


class Steps:
    """The concerns' per-step work, from one callback after all others, in the hub's order: each callback's
    `step_start(trainer, batch_idx)` before a training step and `step_end(trainer, step, outputs, batch)` after it,
    unless None. A callback that works only in some runs or epochs sets its step_start None, or back, at the start of
    training or of an epoch (Steps looks after theirs). Lightning's own call of a hook costs about 15,000
    instructions (its profiler's context, the hook's name built), the hook's work aside: six of them a step made up a
    quarter of the runtime's cost over Lightning's own loop (scripts/bench_overhead.py --instructions). Where no
    callback works at a step's start or end, Steps' own hook is None, which Lightning skips. The trainer's step is
    read once for every step_end."""

    BASE = "callbacks.Callback"

    def __init__(self, callbacks: list):
        self.callbacks = [c for c in callbacks if hasattr(c, "step_start") or hasattr(c, "step_end")]

    def on_train_start(self, trainer, pl_module):
        # those the trainer still has: a script may take one out of its list (scripts/throughput.py)
        self.callbacks = [c for c in self.callbacks if any(c is t for t in trainer.callbacks)]
        self.on_train_epoch_start(trainer, pl_module)  # Lightning calls it for no epoch resumed mid-way

    def on_train_epoch_start(self, trainer, pl_module):
        self._starts = [start for c in self.callbacks if (start := getattr(c, "step_start", None)) is not None]
        self._ends = [end for c in self.callbacks if (end := getattr(c, "step_end", None)) is not None]
        for hook, calls in (("on_train_batch_start", self._starts), ("on_train_batch_end", self._ends)):
            if calls:
                vars(self).pop(hook, None)
            else:
                setattr(self, hook, None)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        for start in self._starts:
            start(trainer, batch_idx)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        for end in self._ends:
            end(trainer, step, outputs, batch)


def listed(value) -> list:
    """A trainer argument that takes one item or a list of them (callbacks, plugins, logger), as a list."""
    return [] if value is None else list(value) if isinstance(value, list | tuple) else [value]


def joined(parts: list[Part]) -> Part:
    """The parts of the hub's list as one, in its order; each attach called in order."""
    attaches = [part.attach for part in parts if part.attach]
    whole = Part(attach=(lambda trainer: [attach(trainer) for attach in attaches]) if attaches else None)
    for part in parts:
        whole.callbacks += part.callbacks
        whole.after_checkpoints += part.after_checkpoints
        whole.plugins += part.plugins
        whole.arguments.update(part.arguments)
    return whole
