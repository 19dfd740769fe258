"""Trinity-RFT's `examples.agentscope_frozenlake.workflow.FrozenLakeWorkflow`: a frozen-lake agent.

    buffer.explorer_input.default_workflow_type:
      examples.agentscope_frozenlake.workflow.FrozenLakeWorkflow
    buffer.explorer_input.taskset.workflow_args: {env_max_steps: 8, agent_max_steps: 10, is_slippery: false}

Trinity-RFT runs an AgentScope ReAct agent against its frozen lake through the OpenAI endpoint;
here it is our `frozen_lake_workflow` with the same workflow_args and rows (`{seed, size, p}`):
up to `agent_max_steps` replies per episode, each reply's move played on a map drawn with G
within `env_max_steps` moves of S, reward 1 on reaching G. Departs from Trinity-RFT: no AgentScope
(the prompts are our environment's, the move is a reply's last direction word rather than the
last fenced block), and an episode is one multi-turn experience rather than one experience per
model call (`multi_step_grpo` scores both the same way: the episode's outcome on every turn).
"""

from trinity.workflows.env_workflow import FrozenLakeWorkflow as _FrozenLake


class FrozenLakeWorkflow(_FrozenLake):
    """`frozen_lake_workflow` under Trinity-RFT's example path (module doc)."""


__all__ = ["FrozenLakeWorkflow"]
