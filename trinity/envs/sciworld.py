"""ScienceWorld (Wang et al., arXiv:2203.07540) as a text environment: elementary-science tasks in a
simulated house, played with text commands (Trinity-RFT's `sciworld_workflow`).

    buffer.explorer_input.default_workflow_type: sciworld_workflow   # env_workflow on `sciworld`
    pip install 'trinity[envs]'    # scienceworld: the simulator is a jar it ships; Java 8+ runs it

A task row names the task and its variation: Trinity-RFT's `task_desc`, a JSON text
`{"task_name": "boil", "var_num": 3, "jar_path": ...}` (its `get_sciworld_data.py` writes them),
or `task_name` and `var_num` as fields. The jar is the row's `jar_path` when that file exists,
else the package's own. The simulator starts (a Java process) at the first reset and stops at
`close`, so building the environment (as `validate` does) costs nothing.

As in Trinity-RFT: the system prompt asks for `<think>...</think>` then one command in
`<action>...</action>` and lists the commands; the first observation is "Observation: \\n" +
"Task Description: " + the task + the room, each later one "Observation: \\n" + the simulator's
reply; a reply without an `<action>` sends an empty command; 30 replies at most; the simplification
is "easy" and the simulator's own step limit 100. The episode's reward is the best score reached
(0-100, from 0) / 100: each step is rewarded by how much it raised the best score so far, so the
rewards sum to it. `success`: the task completed with a score of 100.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

from trinity.envs.base import ENV, TextEnv, message

SYSTEM_PROMPT = """
You are an agent doing scientific experiments in a text-based virtual environment.

## Notes:
At each step, first think, then perform one action to fulfil the instruction. Always wrap your
thinking in <think> </think> tags and your action in <action> </action> tags.
Always take exactly one action per step.
Never try to interact with the user. Finish the task by yourself.

## Action Format:
The commands you can use:
    open OBJ: open a container
    close OBJ: close a container
    activate OBJ: activate a device
    deactivate OBJ: deactivate a device
    connect OBJ to OBJ: connect electrical components
    disconnect OBJ: disconnect electrical components
    use OBJ [on OBJ]: use a device/item
    look around: describe the current room
    examine OBJ: describe an object in detail
    look at OBJ: describe a container's contents
    read OBJ: read a note or book
    move OBJ to OBJ: move an object to a container
    pick up OBJ: move an object to the inventory
    pour OBJ into OBJ: pour a liquid into a container
    mix OBJ: chemically mix a container
    teleport to LOC: teleport to a specific room
    focus on OBJ: signal intent on a task object
    wait: take no action for 10 steps
    wait1: take no action for a step

For example: <think> Now I will check the bedroom ... </think><action>teleport to bedroom</action>
"""


def parse_action(reply: str) -> str:
    """The text between the first `<action>` and the next `</action>`; "" without one."""
    start = reply.find("<action>")
    if start == -1:
        return ""
    start += len("<action>")
    end = reply.find("</action>", start)
    return (reply[start:] if end == -1 else reply[start:end]).strip()


def task_of(row: dict[str, Any]) -> tuple[str, int, str | None]:
    """(task name, variation, jar path or None) of a task row (module doc)."""
    spec = row
    if "task_desc" in row:
        try:
            spec = json.loads(row["task_desc"])
        except (TypeError, json.JSONDecodeError) as e:
            raise ValueError(
                f"sciworld: task_desc is not a JSON object: {row['task_desc']!r}"
            ) from e
    if not isinstance(spec, dict) or "task_name" not in spec or "var_num" not in spec:
        raise ValueError(
            "sciworld: a task row needs task_desc (JSON with task_name and var_num) or task_name "
            f"and var_num, got {sorted(row)}"
        )
    jar = spec.get("jar_path")
    return (
        str(spec["task_name"]),
        int(spec["var_num"]),
        jar if jar and Path(jar).is_file() else None,
    )


def require_scienceworld(what: str) -> None:
    """ValueError unless the `scienceworld` package and Java are here (nothing imported)."""
    if importlib.util.find_spec("scienceworld") is None:
        raise ValueError(
            f"{what} needs the ScienceWorld simulator: pip install scienceworld (it ships its "
            "jar; Java 8 or newer runs it)"
        )
    if shutil.which("java") is None:
        raise ValueError(f"{what}: the ScienceWorld simulator runs on Java; no `java` found")


@ENV.register("sciworld")
class SciWorldText(TextEnv):
    system_prompt = SYSTEM_PROMPT
    max_turns = 30

    def __init__(
        self, max_turns: int | None = None, simplification: str = "easy", step_limit: int = 100
    ) -> None:
        super().__init__(max_turns)
        require_scienceworld("sciworld")
        self.simplification, self.step_limit = simplification, step_limit
        self._sim: Any = None
        self.best = 0.0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, str], dict[str, Any]]:
        super().reset(seed=seed)
        name, variation, jar = task_of(options or {})
        if self._sim is None:
            from scienceworld import ScienceWorldEnv

            self._sim = ScienceWorldEnv("", jar, envStepLimit=self.step_limit)
        self._sim.load(name, variation, self.simplification, generateGoldPath=True)
        obs, _ = self._sim.reset()
        self.turns, self.best, self.score = 0, 0.0, 0.0
        task = self._sim.get_task_description()
        golden = len(self._sim.get_gold_action_sequence())
        return message(f"Observation: \nTask Description: {task}\n{obs}"), {"golden_rounds": golden}

    def step(self, action: str) -> tuple[dict[str, str], float, bool, bool, dict[str, Any]]:
        last = self._turn()
        obs, _, done, info = self._sim.step(parse_action(action))
        self.score = float(info["score"])
        best = max(self.best, self.score)
        reward, self.best = (best - self.best) / 100.0, best
        info = {"reward_components": {"score": reward}, "score": self.score}
        return message(f"Observation: \n{obs}"), reward, bool(done), last and not done, info

    def success(self, terminated: bool, reward: float, info: dict[str, Any]) -> bool:
        return terminated and float(info.get("score", 0.0)) >= 100.0

    def close(self) -> None:
        if self._sim is not None:
            self._sim.close()
            self._sim = None
