"""Workflows: the contract, the registry and the built-in workflows."""

from trinity.workflows import (
    agentscope_math,  # noqa: F401  (agentscope_react_math_workflow, agentscopev0_react_math_workflow)
    agentscope_react,  # noqa: F401  (agentscope_react_workflow, as_react_workflow; lazy agentscope)
    email_search,  # noqa: F401  (email_search_workflow)
    env_workflow,  # noqa: F401  (env_workflow, frozen_lake_workflow)
    judge_workflow,  # noqa: F401  (judge_workflow, group_judge_workflow, math_ruler_workflow)
    math_boxed_workflow,  # noqa: F401  (math_boxed_workflow)
    math_family,  # noqa: F401  (math_rm_workflow, on_policy_distill_*, bots_ref_eval_collect_*)
    math_workflow,  # noqa: F401  (math_workflow, async_math_workflow)
    not_built,  # noqa: F401  (Trinity-RFT's workflows refused by name: alfworld_workflow, ...)
    self_correction,  # noqa: F401  (math_self_correction_workflow)
    toolcall,  # noqa: F401  (toolcall_workflow, tool_call_workflow)
    trainable_ruler,  # noqa: F401  (math_trainable_ruler_workflow)
)
from trinity.workflows.base import WORKFLOW, ModelHandle, SyncWorkflow, Workflow

__all__ = ["WORKFLOW", "ModelHandle", "SyncWorkflow", "Workflow"]
