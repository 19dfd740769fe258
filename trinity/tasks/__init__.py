"""Tasks: dataset rows and generated problems, wrapped for the explorer.

from trinity.tasks import load_taskset, make_selector
tasks = load_taskset(cfg.buffer.explorer_input.taskset, default_reward_fn_type="math_reward")
for batch in make_selector(cfg_selector).batches(tasks, batch_size=16, total_epochs=2): ...
"""

from trinity.tasks.files import TasksetError, read_located_rows, read_rows
from trinity.tasks.selector import (
    SELECTORS,
    RandomSelector,
    SequentialSelector,
    ShuffleSelector,
    TaskSelector,
    make_selector,
)
from trinity.tasks.synthetic import GENERATORS, generate, is_heldout
from trinity.tasks.task import Task
from trinity.tasks.taskset import load_taskset

__all__ = [
    "GENERATORS",
    "SELECTORS",
    "RandomSelector",
    "SequentialSelector",
    "ShuffleSelector",
    "Task",
    "TaskSelector",
    "TasksetError",
    "generate",
    "is_heldout",
    "load_taskset",
    "make_selector",
    "read_located_rows",
    "read_rows",
]
