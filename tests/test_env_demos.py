"""Expert demonstrations of the text environments (`TextEnv.expert_action`, the `env_demos`
generator) and SFT rows with tool definitions (`format.tools_key`): the warm-up data a multi-turn
RL stage starts from must render exactly as the RL prompts do."""

from __future__ import annotations

import asyncio
import json
import textwrap
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest

from trinity.common.plugins import ENV_VAR
from trinity.config import TrinityConfig
from trinity.config.support import not_applicable_notes
from trinity.envs import ENV
from trinity.envs.base import TextEnv, episode_seed, first_prompt, message
from trinity.envs.frozen_lake import FrozenLakeText, shortest_path
from trinity.explorer.engine import SamplingParams
from trinity.explorer.model_client import TaskModelHandle
from trinity.models import load_tokenizer
from trinity.rewards.countdown import countdown_reward, evaluate_expression
from trinity.tasks import TasksetError, generate, load_taskset
from trinity.tasks.synthetic import solve_countdown
from trinity.trainer.sft_data import task_to_sft_experience

# a template that shows whether (and which) tools were rendered, then every message
TOOLS_TEMPLATE = (
    "{% if tools %}[tools:{% for t in tools %}{{ t['function']['name'] }};{% endfor %}]{% endif %}"
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
COUNTDOWN = {"max_number": 9, "max_target": 30}


# -- experts -------------------------------------------------------------------------------------


def test_solve_countdown_uses_the_fewest_numbers_and_exact_division():
    assert solve_countdown([2, 3, 10], 10) == "10"  # a number alone
    assert solve_countdown([2, 3], 6) == "2*3"  # 2+3, 2-3 come first and miss
    assert solve_countdown([1, 1, 1], 30) is None
    found = solve_countdown([3, 5, 7], 22)
    assert found is not None and evaluate_expression(found) == Fraction(22)
    assert evaluate_expression(solve_countdown([2, 4, 9], 18)) == 18  # e.g. 9*4/2 or 2*9


def test_countdown_expert_answers_every_generated_problem():
    rows = generate("countdown", "train", 0, 300, **COUNTDOWN)
    env = ENV.get("countdown_calculator")(**COUNTDOWN)
    for i, row in enumerate(rows):
        first_prompt(env, episode_seed(row, i), row)
        _, reward, terminated, _, info = env.step(env.expert_action())
        assert terminated and info["reward_components"] == {"accuracy": 1.0, "format": 0.0}
        assert reward == countdown_reward(env.expert_action()[8:-9], None, row)["accuracy"] == 1


def test_frozen_lake_expert_walks_a_shortest_safe_path():
    # BFS tries up, down, left, right: (1,0) and (0,1) first; G is first reached from (2,1)
    assert shortest_path(["SFF", "FHF", "FFG"]) == ["down", "down", "right", "right"]
    assert shortest_path(["SHG", "HFF", "FFF"]) is None
    env = FrozenLakeText(size=4, holes=3)
    for seed in range(40):
        env.reset(seed=seed)
        need = len(shortest_path(env.grid))
        for turn in range(need):  # noqa: B007
            _, reward, terminated, _, info = env.step(f"I go {env.expert_action()}")
            assert info["cell"] != "H"
        assert terminated and reward == 1.0 and turn + 1 == need


def test_guess_number_expert_bisects_what_the_answers_left_open():
    env = ENV.get("guess_number")(low=1, high=20)
    for seed in range(50):
        env.reset(seed=seed)
        guesses = []
        while True:
            guesses.append(int(env.expert_action()))
            _, _, terminated, _, _ = env.step(str(guesses[-1]))
            if terminated:
                break
        assert guesses[0] == 10 and guesses[-1] == env.secret
        assert len(guesses) <= 5  # ceil(log2(20)) + 1


def test_an_environment_without_an_expert_says_so():
    class NoExpert(TextEnv):
        def reset(self, *, seed=None, options=None):
            return message("hi"), {}

        def step(self, action):
            return message("ok"), 0.0, True, False, {}

    with pytest.raises(NotImplementedError, match="NoExpert has no expert_action"):
        NoExpert().expert_action()


# -- env_demos -----------------------------------------------------------------------------------


def test_env_demos_write_one_row_per_reply_and_never_play_held_out_problems():
    rows = generate(
        "env_demos", "train", 0, 50, env="countdown_calculator", env_args=COUNTDOWN,
        source="countdown", source_args=COUNTDOWN,
    )  # fmt: skip
    assert len(rows) == 50  # one answer per problem
    assert all([m["role"] for m in r["messages"]] == ["system", "user", "assistant"] for r in rows)
    assert all(r["tools"][0]["function"]["name"] == "calculator" for r in rows)
    held_out = {
        (tuple(r["numbers"]), r["target"])
        for r in generate("countdown", "test", 0, 140, **COUNTDOWN)
    }
    assert not {(tuple(r["numbers"]), r["target"]) for r in rows} & held_out

    lakes = generate(
        "env_demos", "train", 0, 6, env="frozen_lake_text", env_args={"size": 3, "holes": 1}
    )
    episodes = [r for r in lakes if r["turn"] == 0]
    assert len(episodes) == 6
    for r in lakes:  # the conversation up to reply `turn`: reply i is the last message of row i
        replies = [m for m in r["messages"] if m["role"] == "assistant"]
        assert len(replies) == r["turn"] + 1 and r["messages"][-1]["role"] == "assistant"


def test_env_demos_refuse_an_expert_that_cannot_finish():
    with pytest.raises(ValueError, match="did not solve row"):  # 1 move never crosses a 4x4 lake
        generate(
            "env_demos", "train", 0, 20, env="frozen_lake_text",
            env_args={"size": 4, "holes": 0}, max_turns=1,
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"generator_args\.env is required"):
        generate("env_demos", "train", 0, 5)


def test_demo_sft_prompt_is_token_for_token_the_rl_prompt(tiny_model_dir, tmp_path):
    """The SFT row (loaded as a messages taskset, tools from `format.tools_key`) and the first
    chat call `env_workflow` makes on the same problem send the same ids: tools rendered."""
    tok = load_tokenizer(tiny_model_dir, custom_chat_template=TOOLS_TEMPLATE)
    demos = generate(
        "env_demos", "train", 0, 3, env="countdown_calculator", env_args=COUNTDOWN,
        source="countdown", source_args=COUNTDOWN,
    )  # fmt: skip
    path = tmp_path / "demos.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in demos))
    storage = TrinityConfig.model_validate(
        {
            "model": {"model_path": "x"},
            "buffer": {
                "trainer_input": {
                    "experience_buffer": {
                        "name": "demos", "storage_type": "file", "path": str(path),
                        "format": {"prompt_type": "messages"},
                    }
                }
            },
        }
    ).buffer.trainer_input.experience_buffer  # fmt: skip
    tasks = load_taskset(storage, require_response=True)
    sent: list[list[int]] = []

    class Client:  # records what the handle sends to the engines
        async def generate(self, ids, params, key=None):
            sent.append(ids)
            return []

    rows = generate("countdown", "train", 0, 3, **COUNTDOWN)
    for i, (task, row) in enumerate(zip(tasks, rows, strict=True)):
        exp = task_to_sft_experience(task, tok, None, None)
        env = ENV.get("countdown_calculator")(**COUNTDOWN)
        _, first = first_prompt(env, episode_seed(row, i), row)
        handle = TaskModelHandle(Client(), tok, SamplingParams())
        asyncio.run(handle.chat(first, tools=env.tools))
        assert exp.tokens[: exp.prompt_length].tolist() == sent[-1]
        assert tok.decode(sent[-1]).startswith("[tools:calculator;]<system>")
        assert tok.decode(exp.tokens[exp.prompt_length :]).startswith("<answer>")


def test_tools_key_must_hold_tool_definitions(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "a", "tools": [{"name": "x"}]}) + "\n")
    fmt = SimpleNamespace(
        prompt_type="plaintext", prompt_key="question", response_key="answer",
        messages_key="messages", system_prompt=None, reply_prefix=None, tools_key="tools",
    )  # fmt: skip
    storage = SimpleNamespace(
        name="ts", storage_type="file", path=str(path), subset_name=None, split="train",
        format=fmt, rollout_args=None, workflow_args={}, reward_fn_args={},
        default_workflow_type=None, default_reward_fn_type=None, repeat_times=None,
    )  # fmt: skip
    with pytest.raises(TasksetError, match=r"bad.jsonl:1.*format.tools_key"):
        load_taskset(storage)


def test_enable_history_is_accepted_and_listed_as_not_applicable():
    cfg = TrinityConfig.model_validate(
        {"model": {"model_path": "x"}, "explorer": {"rollout_model": {"enable_history": True}}}
    )
    assert any("enable_history" in note for note in not_applicable_notes(cfg))


# -- docs/agentic.md "Add an environment", run as written ------------------------------------------


def test_the_docs_add_an_environment_example_runs_as_written(tmp_path, tiny_model_dir, monkeypatch):
    from gymnasium.utils.env_checker import check_env
    from typer.testing import CliRunner

    from trinity.cli import app
    from trinity.common.experience import Experience

    doc = (Path(__file__).parents[1] / "docs" / "agentic.md").read_text()
    block = doc.split("<!-- add-an-environment -->\n```python\n", 1)[1].split("```", 1)[0]
    plugins = tmp_path / "my_envs"
    plugins.mkdir()
    (plugins / "echo_word.py").write_text(block)
    cfg = tmp_path / "my.yaml"
    cfg.write_text(
        textwrap.dedent(f"""
        project: docs
        name: echo
        checkpoint_root_dir: {tmp_path / "ckpt"}
        model: {{model_path: {tiny_model_dir}, max_response_tokens: 4}}
        algorithm: {{algorithm_type: grpo, repeat_times: 4}}
        buffer:
          batch_size: 4
          total_steps: 2
          explorer_input:
            taskset:
              storage_type: synthetic
              path: env_episodes
              generator_args: {{num_tasks: 40}}
              format: {{prompt_key: question}}
              workflow_args: {{env: echo_word}}
            default_workflow_type: env_workflow
          trainer_input:
            experience_buffer: {{name: exp, storage_type: queue}}
        """)
    )
    out = tmp_path / "exps.jsonl"
    monkeypatch.setenv(ENV_VAR, "")  # the CLI names the plugin folder here: undone after the test
    try:
        r = CliRunner().invoke(
            app,
            ["debug", "workflow", "--config", str(cfg), "--plugin-dir", str(plugins),
             "--task", "2", "--out", str(out)],
        )  # fmt: skip
        assert r.exit_code == 0, r.output
        exps = [Experience.from_dict(json.loads(line)) for line in out.read_text().splitlines()]
        assert len(exps) == 4  # repeat_times episodes of the task's seed
        for e in exps:
            assert e.kind.name == "MULTI_TURN" and e.reward in (0.0, 1.0)
            assert e.metrics["echo"] == e.reward and 1 <= e.metrics["turns"] <= 2
        env_cls = ENV.get("echo_word")
        check_env(env_cls(), skip_render_check=True)
        demos = generate("env_demos", "train", 0, 8, env="echo_word")
        assert len(demos) == 8 and all(
            r["messages"][-1]["content"] == r["messages"][-2]["content"].removeprefix("Word: ")
            for r in demos
        )
    finally:
        ENV._items.pop("echo_word", None)  # the plugin registered into the package's registry


def test_validate_names_an_unknown_env_of_env_demos(tmp_path):
    """A typo in env_demos' env is a problem at its key path in `trinity validate` (it used
    to escape pre-flight as a traceback), exit 2."""
    from typer.testing import CliRunner

    from trinity.cli import app

    example = Path(__file__).parents[1] / "examples" / "envs" / "countdown_calculator.yaml"
    text = example.read_text()
    typo = text.replace(
        "        env: countdown_calculator\n", "        env: countdown_calculatr\n", 1
    )
    assert typo != text
    cfg = tmp_path / "typo.yaml"
    cfg.write_text(typo)
    r = CliRunner().invoke(app, ["validate", "--config", str(cfg)])
    assert r.exit_code == 2, r.output
    assert "experience_buffer.generator_args" in r.output
    assert "unknown env 'countdown_calculatr'" in r.output


def test_frozen_lake_fixed_map_walk():
    env = FrozenLakeText(desc=["SF", "HG"])
    obs, _ = env.reset(seed=0)
    assert obs["content"] == "PF\nHG\nYour move?"
    _, r, done, _, _ = env.step("go right")  # (0,0) -> (0,1), frozen
    assert (r, done) == (0.0, False)
    _, r, done, _, _ = env.step("down")  # (0,1) -> (1,1): the goal
    assert (r, done) == (1.0, True)


def test_frozen_lake_slippery_moves_a_third_each_way_never_back():
    seen: dict[tuple[int, int], int] = {}
    for seed in range(300):
        env = FrozenLakeText(desc=["FFF", "FSF", "FFG"], is_slippery=True)
        env.reset(seed=seed)
        env.step("up")  # from the centre (1,1): up (0,1), or perpendicular left (1,0) / right (1,2)
        seen[env.pos] = seen.get(env.pos, 0) + 1
    assert set(seen) == {(0, 1), (1, 0), (1, 2)}
    assert all(60 <= k <= 140 for k in seen.values())  # ~100 each; 3 SE ~ 25
    env = FrozenLakeText(desc=["FFF", "FSF", "FFG"], is_slippery=True)  # one seed, one slip
    env.reset(seed=7)
    env.step("up")
    again = FrozenLakeText(desc=["FFF", "FSF", "FFG"], is_slippery=True)
    again.reset(seed=7)
    again.step("up")
    assert again.pos == env.pos


def test_frozen_lake_trinity_maps_keep_the_goal_within_env_max_steps():
    lengths = []
    for seed in range(40):
        env = FrozenLakeText(p=0.6, max_steps=3)
        env.reset(seed=seed, options={"size": 5})
        grid = env.grid
        assert len(grid) == 5 and all(len(r) == 5 for r in grid)
        assert "".join(grid).count("S") == 1 and "".join(grid).count("G") == 1
        lengths.append(len(shortest_path(grid)))
    assert max(lengths) <= 3 and min(lengths) >= 1
    # the row's p: 1.0 freezes every cell
    env = FrozenLakeText(p=0.5)
    env.reset(seed=1, options={"size": 4, "p": 1.0})
    assert "H" not in "".join(env.grid)
