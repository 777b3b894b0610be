"""Which of a sharded last.ckpt/'s saves stay (checkpoints/retention.py's rule), without a trainer or torch: the new
save and the complete one before it; a second save at a step replaces that step's save, not the one before.

    .venv/bin/pytest tests/unit/checkpoints/test_retention.py
"""

import pytest

from sagemaker_lightning.checkpoints.retention import Saves

pytestmark = pytest.mark.unit


def test_each_save_keeps_itself_and_the_one_before():
    saves, keep = Saves().add("step-1", again=False)
    assert keep == {"step-1"}  # a first save: nothing before it
    saves, keep = saves.add("step-2", again=False)
    assert keep == {"step-1", "step-2"}
    saves, keep = saves.add("step-3", again=False)
    assert keep == {"step-2", "step-3"} and saves == Saves("step-3", "step-2")


def test_a_second_save_at_a_step_replaces_that_steps_save_not_the_one_before():
    saves, _ = Saves().add("step-1", again=False)
    saves, _ = saves.add("step-2a", again=False)
    saves, keep = saves.add("step-2b", again=True)  # last.ckpt again once ModelCheckpoint updated its state
    assert keep == {"step-1", "step-2b"}
    _, keep = saves.add("step-3", again=False)
    assert keep == {"step-2b", "step-3"}


def test_a_save_at_the_step_resumed_from_keeps_the_save_resumed_from():
    saves, keep = Saves("step-3-resumed").add("step-3-stop", again=True)  # a stop right after the resume
    assert keep == {"step-3-resumed", "step-3-stop"}
    _, keep = saves.add("step-4", again=False)
    assert keep == {"step-3-stop", "step-4"}
