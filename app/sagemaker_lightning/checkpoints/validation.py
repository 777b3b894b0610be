"""last.ckpt and the fit's validation, as Lightning's loops count it, so that a run resumed from last.ckpt runs each
validation the uninterrupted run ran: a save due at a step that a validation follows waits until after it
(`validation_follows`: Lightning would count that validation as run), and a stop's save inside one is made as if it had
not begun (`validation_not_run`). LastCheckpoint's; Lightning's private loop state is read here only.

    with validation_not_run(trainer):
        trainer.save_checkpoint(path)
"""

import contextlib


def validation_follows(trainer) -> bool:
    """Whether the fit runs a validation after the step that just ended."""
    fit_loop = trainer.fit_loop
    return fit_loop.epoch_loop._should_check_val_fx(fit_loop._data_fetcher)


@contextlib.contextmanager
def validation_not_run(trainer):
    """A save inside a fit's validation as one made before it began: Lightning, resumed from it, runs that validation
    whole (it takes a validation whose batches it counts as done for run, and skips it: its metrics, the best
    checkpoint's choice and a tuning job's objective line for that epoch would be lost)."""
    if not trainer.validating or trainer.sanity_checking:
        yield
        return
    progress = trainer.fit_loop.epoch_loop.val_loop.batch_progress
    kept, before = progress.state_dict(), progress.total.completed - progress.current.completed
    for counter, done in ((progress.total, before), (progress.current, 0)):  # one batch begun, none processed:
        counter.ready = counter.started = done + 1  # Lightning's mark of a validation cut short, which it runs
        counter.processed = counter.completed = done  # again from its first batch
    try:
        yield
    finally:
        progress.load_state_dict(kept)
