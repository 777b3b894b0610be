"""What the runtime does at every training step, kept cheap (scripts/bench_overhead.py measures it) without losing
what it is for: the stop agreement (agreement.StopTogether) between two real gloo processes, at training steps and in a
validation whose ranks run different numbers of batches, the hooks Lightning need not call (lightning_package.made),
and the one callback that calls the runtime's work at every step (concern.Steps).

    .venv/bin/pytest tests/unit/stop/test_per_step.py
"""

import datetime
import itertools
import os
import signal
import threading
import time
from types import SimpleNamespace
from typing import NamedTuple

import pytest
import pytorch_lightning
import spawned
import torch
import torch.distributed as dist
from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset
from pytorch_lightning.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader, IterableDataset

from sagemaker_lightning.progress import LogLines
from sagemaker_lightning.stop.agreement import StopTogether
from sagemaker_lightning.toolbox import lightning_package
from sagemaker_lightning.toolbox.concern import Steps

pytestmark = pytest.mark.unit

CALLS = 10  # hook calls of each rank: the signal comes before one call of rank 1 only
SIGNALLED = (0, 3, CALLS - 1)  # the first step or batch, one between two agreements, the last
PACE = (0.08, 0.04)  # each rank's seconds per training step (its StopTogether's clock)
# Training steps that agree: the first, then every (3 + 6) // 2 = 4 steps, the mean of what each rank's pace
# proposes for StopTogether.AGREE_EVERY_S (0.25 s: 3.125 and 6.25 steps)
AGREED = (0, 1, 5, 9)


def agreeing(rank: int, port: int, out) -> None:
    """One rank: for each signalled call, StopTogether on a trainer of its parts, `CALLS` training steps; whether it
    had stopped after each goes to `out`."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=20))
    strategy = pytorch_lightning.strategies.DDPStrategy(
        accelerator=pytorch_lightning.accelerators.CPUAccelerator(), parallel_devices=[torch.device("cpu")] * 2
    )
    strategy._launcher = None
    decided = {}
    for signalled in SIGNALLED:
        trainer = SimpleNamespace(
            world_size=2,
            strategy=strategy,
            fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace()),
            _signal_connector=SimpleNamespace(received_sigterm=False, _sigterm_notifier_fn=None),
        )
        stop = lightning_package.made(StopTogether, pytorch_lightning)()
        stop.clock = lambda: call * PACE[rank]  # noqa: B023 (the call under way)
        stop.setup(trainer, None, "fit")
        decided[signalled] = []
        for call in range(CALLS):
            if rank == 1 and call == signalled:
                trainer._signal_connector._sigterm_notifier_fn(15, None)  # the SIGTERM handler
            try:
                trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor()  # where Lightning calls it: before a step
            except SIGTERMException:
                assert trainer._signal_connector.received_sigterm
            decided[signalled].append(trainer._signal_connector.received_sigterm)
    out.put((rank, decided))
    dist.destroy_process_group()


def test_ranks_stop_together_at_the_step_the_signal_came_in(free_port):
    """In place of Lightning's own collective before each step, both ranks stop (SIGTERMException, which saves
    last.ckpt) before the same step: the first agreed one after the signal, though the ranks go at different paces.
    The signal at the first step, between two agreements, and at the last."""
    expected = {n: [call >= min(a for a in AGREED if a >= n) for call in range(CALLS)] for n in SIGNALLED}
    assert spawned.two_ranks(agreeing, free_port(), timeout_s=120) == {0: expected, 1: expected}


VALIDATION_BATCHES = (3, 7)  # each rank's: uneven, as an IterableDataset's shards or its own DataLoader leave them
UNEVEN_TIMEOUT_S = 15  # the process group's: a collective of one rank that no peer pairs fails in that time


class Fit(NamedTuple):
    """One fit of `validating`."""

    signal: tuple[int, int, int] | None = None  # a SIGTERM: the rank whose validation step sends it, at which batch
    # of the first validation, to which rank; rank 1 sends it once rank 0 ran its last batch
    stream: bool = False  # the validation sets are Streams, whose end Lightning finds only after their last batch
    waits: tuple[int, int] | None = None  # the (rank, batch) that waits for the validation's decision: it must see it
    # at that batch's end
    still: bool = False  # rank 1's StopTogether clock stands still: no time passes between its validation's start and
    # a batch's end (a look rate-limited by time never comes)


FITS = (
    Fit(),
    Fit(stream=True),
    Fit((1, 4, 1)),  # to itself, once rank 0 ran its last batch
    Fit((0, 0, 0), stream=True, waits=(1, 0), still=True),  # to itself; rank 1 learns at its first batch's end
    Fit((1, 6, 1)),  # to itself in its last batch, once rank 0 ran its own
    Fit((1, 4, 0), waits=(1, 4)),  # to rank 0, which waits after its last batch; rank 1 learns at its next look
)


class Stream(IterableDataset):
    """Samples of unknown number: no batch is known to be the last until the next is asked for."""

    def __init__(self, size: int, length: int):
        self.samples = RandomDataset(size, length)

    def __iter__(self):
        return iter(self.samples)


def wait_until(done, timeout_s: float = UNEVEN_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)


class Uneven(BoringModel):
    """BoringModel of 4 training steps, a validation after step 2 and 4 with this rank's VALIDATION_BATCHES, the
    signal and the wait of its Fit (the ranks' pids: the test's own keys in the store)."""

    def __init__(self, rank: int, fit: Fit):
        super().__init__()
        self.rank, self.fit = rank, fit
        self.seen: list[int] = []  # each validation's batches

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 8), batch_size=2)

    def val_dataloader(self):
        return DataLoader((Stream if self.fit.stream else RandomDataset)(32, VALIDATION_BATCHES[self.rank]))

    def on_validation_epoch_start(self):
        self.seen.append(0)

    def validation_step(self, batch, batch_idx):
        stop = next(c for c in self.trainer.callbacks if isinstance(c, StopTogether))
        stop.store.set(f"test/pid/{self.rank}", str(os.getpid()))
        if self.fit.signal and self.fit.signal[:2] == (self.rank, batch_idx) and len(self.seen) == 1:
            if self.rank == 1:
                wait_until(lambda: stop.store.add(stop.key + "/arrived", 0) == 1)
            os.kill(int(stop.store.get(f"test/pid/{self.fit.signal[2]}")), signal.SIGTERM)
        if self.fit.waits == (self.rank, batch_idx) and len(self.seen) == 1:
            wait_until(lambda: stop.store.check([stop.key]))
        self.seen[-1] += 1
        return super().validation_step(batch, batch_idx)


class Stopped(pytorch_lightning.Callback):
    """Where the stop found this rank; every rank gathers every rank's (as a checkpoint's save does, a collective
    that mispairs when a rank is elsewhere)."""

    def on_exception(self, trainer, pl_module, exception):
        self.found = [None] * trainer.world_size
        dist.all_gather_object(self.found, (trainer.global_step, trainer.validating))


def validating(rank: int, port: int, out) -> None:
    """One rank of a real DDP fit (gloo, 2 processes) for each of FITS; what each fit ended with goes to `out`."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank), NODE_RANK="0")
    ended = []
    for fit in FITS:
        model, stopped, stop = Uneven(rank, fit), Stopped(), lightning_package.made(StopTogether, pytorch_lightning)()
        if fit.still and rank == 1:
            stop.clock = lambda: 0.0
        trainer = pytorch_lightning.Trainer(
            accelerator="cpu",
            devices=2,
            strategy=pytorch_lightning.strategies.DDPStrategy(timeout=datetime.timedelta(seconds=UNEVEN_TIMEOUT_S)),
            use_distributed_sampler=False,  # each rank its own validation set, of its own length
            max_steps=4,
            val_check_interval=2,
            num_sanity_val_steps=0,
            limit_val_batches=10 if fit.stream else None,
            callbacks=[stop, stopped],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        try:
            trainer.fit(model)
        except SIGTERMException:
            ended.append(("stopped", stopped.found, model.seen))
        else:
            ended.append(("ended", trainer.global_step, model.seen))
    out.put((rank, ended))
    dist.destroy_process_group()


def test_a_validation_of_uneven_ranks_ends_and_a_stop_in_it_stops_every_rank(free_port):
    """Ranks that run different numbers of validation batches (which plain Lightning accepts) finish their fit. A
    SIGTERM to one rank in a validation stops every rank there, at the same step: each after the batch it was in
    when it learned of the stop, a rank past its last batch at that one; or right after the validation, once every
    rank ran its last batch. Then a collective pairs (the checkpoint's save). The agreement used to be an all-reduce
    after each validation batch, which mispaired here."""
    results = spawned.two_ranks(validating, free_port(), timeout_s=300)
    in_it, after_it = ("stopped", [(2, True)] * 2), ("stopped", [(2, False)] * 2)
    for rank, (free, streamed, late, early, last, waiting) in results.items():
        assert free == streamed == ("ended", 4, [VALIDATION_BATCHES[rank]] * 2)  # both validations whole
        assert late == (*in_it, [(3, 5)[rank]])  # rank 1 after batch 4, where it was signalled
        assert early == (*in_it, [1])  # rank 0 after batch 0; rank 1 after its batch 0, where it waited
        assert last == (*after_it, [VALIDATION_BATCHES[rank]])
        assert waiting == (*in_it, [(3, 5)[rank]])  # rank 0 where it waited; rank 1 after the batch it waited in


def test_a_rank_past_its_last_validation_batch_waits_for_its_peers_at_most_the_stores_timeout(free_port):
    """A peer that never ends its validation (its process is gone) holds a rank past its last batch for the store's
    timeout (dist_timeout), not forever: the validation is then DONE, and a later STOP loses. A rank signalled while
    it waits decides STOP and stops there."""
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=datetime.timedelta(seconds=30))
    trainer = SimpleNamespace(world_size=2, global_rank=1, _signal_connector=SimpleNamespace(received_sigterm=False))
    stop = lightning_package.made(StopTogether, pytorch_lightning)()
    ticks = itertools.count()
    stop.clock = lambda: 10.0 * next(ticks)  # 10 s at each look: the timeout passes at the fourth
    stop.pending, stop.store, stop.key = False, store, "gone"
    waiting = threading.Thread(target=stop._arrive, args=(trainer,), daemon=True)
    waiting.start()
    waiting.join(timeout=60)
    assert not waiting.is_alive(), "still waiting, long after the store's timeout"
    assert store.get("gone") == b"done" and store.compare_set("gone", "", "stop") == b"done"
    assert not trainer._signal_connector.received_sigterm
    stop.pending, stop.key = True, "signalled"
    with pytest.raises(SIGTERMException):
        stop._arrive(trainer)
    assert store.get("signalled") == b"stop" and trainer._signal_connector.received_sigterm


@pytest.mark.parametrize(("seconds_per_step", "agreed"), [(1e-6, [0, 1, 101, 201]), (0.0, [0, 1, 101, 201])])
def test_agreements_are_at_most_most_steps_apart(seconds_per_step, agreed):
    """A pace too fast to time (a microsecond a step, or a clock that does not move) proposes more steps than
    MOST_STEPS: the next agreement comes after MOST_STEPS steps, so a stop after a pace that drops (a data stall)
    waits that many steps at most. The agreement itself (one all-reduce) is left out: each rank proposes alone."""
    trainer = SimpleNamespace(
        world_size=2,
        strategy=SimpleNamespace(launcher=None),
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace()),
        _signal_connector=SimpleNamespace(received_sigterm=False, _sigterm_notifier_fn=None),
    )
    stop = lightning_package.made(StopTogether, pytorch_lightning)()
    stop.clock = lambda: step * seconds_per_step  # noqa: B023 (the step under way)
    calls = []
    stop.agree = lambda trainer, proposal: calls.append(step) or proposal  # noqa: B023
    stop.setup(trainer, None, "fit")
    for step in range(250):  # noqa: B007 (the clock and agree read it)
        trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor()
    assert calls == agreed and StopTogether.MOST_STEPS == 100


def test_callbacks_leave_out_the_hooks_they_do_not_define():
    """Lightning calls each hook of each callback at every step unless it is None; the hooks a callback defines, and
    those Lightning calls without that check, stay. A step's work is not a hook: Steps calls it (next test)."""
    made = lightning_package.made(LogLines, pytorch_lightning)()
    assert made.on_before_backward is None and made.on_validation_batch_end is None and made.on_train_batch_end is None
    assert callable(made.step_end) and callable(made.on_train_start)
    assert callable(made.on_save_checkpoint) and callable(made.on_load_checkpoint) and callable(made.state_dict)


class Worker:
    """A concern's callback with work at every step, which records it."""

    BASE = "callbacks.Callback"

    def __init__(self, name: str, calls: list):
        self.name, self.calls = name, calls

    def step_start(self, trainer, batch_idx):
        self.calls.append((self.name, "start", batch_idx))

    def step_end(self, trainer, step, outputs, batch):
        self.calls.append((self.name, "end", step, float(outputs["loss"])))


def test_one_callback_calls_each_callbacks_work_at_every_step_in_order():
    """Steps calls step_start before each training step and step_end after it with the trainer's step and the step's
    outputs, in its list's order; it skips one set to None (a callback that works only in some runs) and one the
    trainer no longer has (a script took it out); where none works at a step's start, Lightning has nothing to call."""
    calls: list = []
    a, b, gone = (lightning_package.made(Worker, pytorch_lightning)(name, calls) for name in "ab-")
    b.step_start = None
    steps = lightning_package.made(Steps, pytorch_lightning)([a, b, gone])
    trainer = pytorch_lightning.Trainer(
        max_steps=2, callbacks=[a, b, gone, steps], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
    )  # fmt: skip
    trainer.callbacks.remove(gone)
    trainer.fit(BoringModel())
    losses = [c[3] for c in calls if c[:2] == ("a", "end")]
    assert calls == [("a", "start", 0), ("a", "end", 1, losses[0]), ("b", "end", 1, losses[0]),
                     ("a", "start", 1), ("a", "end", 2, losses[1]), ("b", "end", 2, losses[1])]  # fmt: skip
    only_b = lightning_package.made(Steps, pytorch_lightning)([b])  # no work at a step's start: Lightning skips it
    only_b.on_train_start(SimpleNamespace(callbacks=[b]), None)
    assert only_b.on_train_batch_start is None and callable(only_b.on_train_batch_end)
    vars(b).pop("step_start")  # set back at an epoch's start, as StreamingEpochs does: called again
    only_b.on_train_epoch_start(None, None)
    assert callable(only_b.on_train_batch_start)
