"""Run a text environment (`trinity.envs`) as a multi-turn workflow: one experience per episode.

    buffer.explorer_input.default_workflow_type: env_workflow
    buffer.explorer_input.taskset.workflow_args:
      {env: guess_number, env_args: {low: 1, high: 20}, max_turns: 6}

Per task, `repeat_times` episodes of the environment, every one reset with the same seed (the
task row's `seed`, else the task's index) and the same options (the task row: e.g.
`countdown_calculator` takes its `numbers` and `target`), so a GRPO group compares episodes of
one problem. The first prompt is the environment's `system_prompt` (if any) and its reset
observation, sent with `tools=env.tools`; the first turn is one `chat` call with n samples, each
episode is then continued by its own n=1 calls (bridged: the sampled tokens + the observation's
delta). Each reply's decoded text is the action; the observation `step` returns is appended. An
episode ends when the environment terminates or truncates it, after `max_turns` replies, or when
its prompt outgrew `model.max_prompt_tokens` (a `prompt_truncated` sample, not stepped).

Each episode is one MULTI_TURN experience (`extract_experiences`: replies trained, observations
masked). Reward: the sum of the episode's step rewards. Metrics: every reward component summed
over the episode, `turns` (replies given), `success` (1.0 when `env.success(terminated, reward,
info)` says the last step solved it; for the built-ins: terminated with a positive last reward,
and for countdown a correct answer), `truncated` (ended by a turn limit, not by the environment).

`frozen_lake_workflow` (Trinity-RFT's name) is this workflow with `frozen_lake_text`,
`sciworld_workflow` with `sciworld`. Every environment is closed when its task ends.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from trinity.common.experience import Experience
from trinity.common.rollout import Sample
from trinity.envs import ENV
from trinity.envs.base import episode_seed, first_prompt
from trinity.workflows.base import WORKFLOW, ModelHandle, Workflow, built_arg_problems


@WORKFLOW.register("env_workflow")
class EnvWorkflow(Workflow):
    def __init__(
        self, env: str, env_args: dict[str, Any] | None = None, max_turns: int | None = None
    ) -> None:
        """`env`: an `ENV` name or a dotted path to a gymnasium text env class; `env_args`: its
        constructor's keyword arguments; `max_turns`: replies per episode at most (default: the
        environment's own `max_turns`). Raises ValueError naming the bad argument."""
        super().__init__(env=env, env_args=env_args, max_turns=max_turns)
        self.env_name = env
        self.env_cls = ENV.get(env)
        self.env_args = dict(env_args or {})
        self._make()  # a bad env_args fails here, before any sampling
        limit = max_turns if max_turns is not None else getattr(self._make(), "max_turns", None)
        if limit is None:
            raise ValueError(
                f"env_workflow: env {env!r} has no max_turns attribute; set workflow_args.max_turns"
            )
        if limit < 1:
            raise ValueError(f"env_workflow: max_turns must be >= 1, got {limit}")
        self.max_turns = int(limit)

    @classmethod
    def arg_problems(cls, args: dict[str, Any]) -> list[str]:
        """What is wrong with `workflow_args` (pre-flight): building the workflow checks them."""
        return built_arg_problems(cls, args)

    def _make(self) -> Any:
        try:
            return self.env_cls(**self.env_args)
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"env_workflow: env {self.env_name!r} refused env_args {self.env_args}: {e}"
            ) from e

    async def run(self, task: Any, model: ModelHandle) -> list[Experience]:
        """1. reset: one environment per episode, same seed and options; the first prompt
        2. first turn: one chat call with n samples (n = repeat_times), one per episode
        3. per turn: step every open episode's environment (in a thread), then continue the
           episodes still open, concurrently, in episode order
        4. one MULTI_TURN experience per episode, rewarded by its summed step rewards
        """
        envs: list[Any] = []  # closed when the task ends (a simulator's process stops)
        try:
            return await self._run(task, model, envs)
        finally:
            for env in envs:
                env.close()

    async def _run(self, task: Any, model: ModelHandle, envs: list[Any]) -> list[Experience]:
        seed, options = episode_seed(task.raw, task.index), dict(task.raw)
        # 1. (resets run in a thread: a simulator may take seconds to start)
        probe = self._make()
        envs.append(probe)
        obs, first = await asyncio.to_thread(first_prompt, probe, seed, options)
        tools = getattr(probe, "tools", None)
        # 2.
        samples = await model.chat(first, tools=tools)
        episodes = [_Episode(self._make(), [*first]) for _ in samples]
        envs += [ep.env for ep in episodes]
        for ep in episodes:
            again, _ = await asyncio.to_thread(ep.env.reset, seed=seed, options=options)
            if dict(again) != dict(obs):
                raise ValueError(
                    f"env_workflow: env {self.env_name!r} reset with seed {seed} gave two "
                    "different first observations; an episode must depend on its seed alone"
                )
        last = list(samples)
        # 3.
        open_ = list(range(len(episodes)))
        while open_:
            await asyncio.to_thread(self._step_all, model, [(episodes[i], last[i]) for i in open_])
            open_ = [i for i in open_ if not episodes[i].done]
            if not open_:
                break
            replies = await asyncio.gather(
                *(model.chat(episodes[i].messages, tools=tools, n=1) for i in open_)
            )
            for i, (s,) in zip(open_, replies, strict=True):
                last[i] = s
        # 4.
        by_episode = {model.episode_of(s): j for j, s in enumerate(samples)}
        rewards = {run: episodes[j].reward for run, j in by_episode.items()}
        out = model.extract_experiences(reward=rewards)
        for e in out:
            ep = episodes[by_episode[e.eid.run]]
            e.metrics = {
                **ep.components,
                "turns": float(ep.turns),
                "success": float(ep.success),
                "truncated": float(ep.truncated),
            }
            e.response_text = ep.last_text
            e.info.update({"task_index": task.index, "seed": seed, "env": self.env_name})
        return out

    def _step_all(self, model: ModelHandle, pairs: list[tuple[_Episode, Sample]]) -> None:
        for ep, sample in pairs:
            ep.step(model, sample, self.max_turns)


class _Episode:
    """One episode's environment, message list and running totals."""

    def __init__(self, env: Any, messages: list[dict[str, Any]]) -> None:
        self.env, self.messages = env, messages
        self.reward, self.turns = 0.0, 0
        self.components: dict[str, float] = {}
        self.done = self.success = self.truncated = False
        self.last_text = ""

    def step(self, model: ModelHandle, sample: Sample, max_turns: int) -> None:
        """Act with the sample's reply; append it and the observation; update the totals."""
        self.turns += 1
        self.last_text = text = model.decode(sample.response_ids)
        self.messages.append({"role": "assistant", "content": text})
        if sample.finish_reason == "prompt_truncated":  # the prompt outgrew the model: stop
            self.done = self.truncated = True
            return
        obs, reward, terminated, truncated, info = self.env.step(text)
        self.reward += float(reward)
        for k, v in info.get("reward_components", {}).items():
            self.components[k] = self.components.get(k, 0.0) + float(v)
        self.messages.append(dict(obs))
        out_of_turns = self.turns >= max_turns
        self.done = bool(terminated or truncated or out_of_turns)
        self.truncated = self.done and not terminated
        judge = getattr(self.env, "success", None)
        if terminated:
            self.success = bool(judge(True, float(reward), info) if judge else float(reward) > 0)


@WORKFLOW.register("frozen_lake_workflow")
class FrozenLakeWorkflow(EnvWorkflow):
    """Trinity-RFT's `frozen_lake_workflow`: `env_workflow` on `frozen_lake_text`.

    Trinity-RFT's workflow_args: `agent_max_steps` (replies per episode), `env_max_steps` (the
    map is drawn Trinity-RFT's way, each cell frozen with the row's chance `p`, default 0.8, on
    the row's `size`, until G is within this many moves of S), `is_slippery`, `desc` (a fixed
    map). Without `env_max_steps`, the grid's size and holes are `env_args: {size, holes}` (a
    row's `seed` draws the map). `trinity/envs/frozen_lake.py` says where the lake departs from
    Trinity-RFT's. Rows need no prompt (Trinity-RFT's are `{seed, size, p, ...}`)."""

    row_fields: ClassVar[tuple[str, ...]] = ()  # the environment writes the prompt

    def __init__(
        self,
        agent_max_steps: int | None = None,
        is_slippery: bool = False,
        desc: list[str] | None = None,
        env_max_steps: int | None = None,
        env_args: dict[str, Any] | None = None,
        max_turns: int | None = None,
    ) -> None:
        if agent_max_steps is not None and max_turns is not None:
            raise ValueError("frozen_lake_workflow: set agent_max_steps or max_turns, not both")
        if not isinstance(is_slippery, bool):
            raise ValueError(
                f"frozen_lake_workflow: is_slippery must be true or false, got {is_slippery!r}"
            )
        args = dict(env_args or {})
        trinity = {"is_slippery": is_slippery, "desc": desc, "max_steps": env_max_steps}
        for key, value in trinity.items():
            if key in args and value not in (None, False):
                raise ValueError(f"frozen_lake_workflow: {key} is set twice (in env_args too)")
            if value not in (None, False):
                args[key] = value
        if env_max_steps is not None:
            args.setdefault("p", 0.8)  # Trinity-RFT's default frozen chance (a row's `p` wins)
        turns = agent_max_steps if agent_max_steps is not None else max_turns
        super().__init__(env="frozen_lake_text", env_args=args, max_turns=turns)


@WORKFLOW.register("sciworld_workflow")
class SciWorldWorkflow(EnvWorkflow):
    """Trinity-RFT's `sciworld_workflow`: `env_workflow` on `sciworld` (ScienceWorld).

    Rows are Trinity-RFT's (`task_desc`: JSON naming the task and its variation); up to 30
    replies per episode (`max_turns`); `env_args`: `simplification`, `step_limit`. Needs the
    `scienceworld` package and Java (`trinity/envs/sciworld.py`)."""

    row_fields: ClassVar[tuple[str, ...]] = ()  # the environment reads the row's task

    def __init__(
        self, max_turns: int | None = None, env_args: dict[str, Any] | None = None
    ) -> None:
        from trinity.envs.sciworld import require_scienceworld

        require_scienceworld("sciworld_workflow")
        super().__init__(env="sciworld", env_args=env_args, max_turns=max_turns)
