"""The frozen-lake agent (Trinity-RFT's examples/agentscope_frozenlake): the workflow its config
names by dotted path."""
