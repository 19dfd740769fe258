"""Trinity-RFT's `examples.bots.workflow.bots_math_boxed_workflow` path, for its BOTS configs:

    buffer.explorer_input.default_workflow_type:
      examples.bots.workflow.bots_math_boxed_workflow.BOTSMathBoxedWorkflow

The workflows are `trinity.workflows.math_family`'s (its docstring says how they score and log).
"""

from trinity.workflows.math_family import (
    BOTSMathBoxedWorkflow,
    BOTSRefEvalCollectMathBoxedWorkflow,
)

__all__ = ["BOTSMathBoxedWorkflow", "BOTSRefEvalCollectMathBoxedWorkflow"]
