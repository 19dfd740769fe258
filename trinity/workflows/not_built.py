"""Trinity-RFT's workflows that cannot run here, refused by name with the reason.

`validate` and `run` say "workflow 'alfworld_workflow': not built here: needs ...", not "unknown
workflow", so a user arriving with Trinity-RFT's example config learns what is missing.

- ALFWorld (`alfworld_workflow`, `step_wise_alfworld_workflow`, `RAFT_alfworld_workflow`,
  `RAFT_reflect_alfworld_workflow`): the `alfworld` package (with TextWorld) is on the package
  registry, but its game files (PDDL problems and TextWorld games, `alfworld-download`) come from
  a download site this machine cannot reach, and every task row names one (`game_file`).
- WebShop (`webshop_workflow`): needs the WebShop web server with its product catalogue and
  search index (a separate repository with a data download), which no package provides.
- `agentscope_v1_react_search_workflow`: its agent's tool searches the web (Tavily's service or
  a SearXNG server, `workflow_args.search_client_type`, through npx MCP servers), which cannot be
  reached here.
- `simple_mm_workflow`, `async_simple_mm_workflow`: multi-modal data (`format.image_key`), not
  built (`config.buffer_schema.MULTIMODAL_NOT_BUILT` says why).
"""

from __future__ import annotations

from trinity.config.buffer_schema import MULTIMODAL_NOT_BUILT
from trinity.workflows.base import WORKFLOW

_ALFWORLD = (
    "needs the ALFWorld environment package and its game files (TextWorld games and PDDL "
    "problems fetched by `alfworld-download`), which cannot be downloaded here"
)

NOT_BUILT: dict[str, str] = {
    "alfworld_workflow": _ALFWORLD,
    "step_wise_alfworld_workflow": _ALFWORLD,
    "RAFT_alfworld_workflow": _ALFWORLD,
    "RAFT_reflect_alfworld_workflow": _ALFWORLD,
    "webshop_workflow": (
        "needs the WebShop server with its product catalogue and search index, which no "
        "package provides and which cannot be downloaded here"
    ),
    "agentscope_v1_react_search_workflow": (
        "its agent's search tool queries the web (Tavily's service or a SearXNG server, through "
        "MCP servers run by npx), which cannot be reached here"
    ),
    "simple_mm_workflow": f"multi-modal data: {MULTIMODAL_NOT_BUILT}",
    "async_simple_mm_workflow": f"multi-modal data: {MULTIMODAL_NOT_BUILT}",
}

for _name, _why in NOT_BUILT.items():
    WORKFLOW.refuse(_name, _why)
