"""Workflows: the contract, the registry and the built-in workflows."""

from trinity.workflows import (
    agentscope_react,  # noqa: F401  (agentscope_react_workflow, as_react_workflow; lazy agentscope)
    env_workflow,  # noqa: F401  (env_workflow, frozen_lake_workflow)
    judge_workflow,  # noqa: F401  (judge_workflow, group_judge_workflow, math_ruler_workflow)
    math_boxed_workflow,  # noqa: F401  (math_boxed_workflow)
    math_workflow,  # noqa: F401  (registers math_workflow)
    self_correction,  # noqa: F401  (math_self_correction_workflow)
)
from trinity.workflows.base import WORKFLOW, ModelHandle, SyncWorkflow, Workflow

__all__ = ["WORKFLOW", "ModelHandle", "SyncWorkflow", "Workflow"]
