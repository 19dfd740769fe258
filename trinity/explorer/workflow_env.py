"""`explorer.env_vars`: environment variables for the code of workflows.

    explorer: {env_vars: {TMPDIR: /scratch/tmp, MY_ENV_SERVER: "http://localhost:8000"}}

Workflows run in the explorer's process (coroutines on its event loop, `SyncWorkflow`s on its
threads, and any subprocess they start): that process is what Trinity-RFT's workflow runners
are, whose Ray runtime_env carries these variables. Two places set them:

- the explorer's actor is started with them in its Ray runtime_env (`actor_options`), so its
  process has them before it imports anything (a library that reads one at import sees it);
  the engine actors, the trainer and the run's services are other processes and do not;
- the explorer puts them in `os.environ` when it is built (`apply`), which is what sets them in
  the one-process layout, where the explorer is an object of the run's one process (a Ray
  worker, or the driver itself when the run needs no Ray): there they are that whole process's,
  the trainer's included, from the explorer's start on, and a library that read a variable at
  its import keeps what it read (`validate` says so in a note). `trinity debug workflow` sets
  them too. Values are strings, as Ray and `os.environ` take them.
"""

from __future__ import annotations

import os
from typing import Any

from trinity.common.plugins import plugin_env


def env_vars(cfg: Any) -> dict[str, str]:
    """The variables `explorer.env_vars` sets, as strings."""
    return {str(k): str(v) for k, v in (cfg.explorer.env_vars or {}).items()}


def actor_options(cfg: Any) -> dict[str, Any]:
    """Ray options for the explorer's actor: a runtime_env with the variables (and the plugin
    directories the job's runtime_env names, which Ray would also merge in); {} without any."""
    own = env_vars(cfg)
    if not own:
        return {}
    return {"runtime_env": {"env_vars": plugin_env() | own}}


def apply(cfg: Any) -> None:
    """Set the variables in this process's environment (module doc)."""
    os.environ.update(env_vars(cfg))


ONE_PROCESS_NOTE = (
    "explorer.env_vars: where the run is one process (cluster.one_process, or the plan's choice "
    "on one CPU-only machine) the variables are set in that process when its explorer starts, "
    "so its trainer sees them too, and a library imported before then keeps what it read; "
    "cluster.one_process: false gives them to the explorer's process alone"
)
