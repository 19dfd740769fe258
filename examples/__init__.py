"""Example configs, and the example code Trinity-RFT's example configs name by dotted path
(`examples.bots.workflow...`, `examples.learn_to_ask.workflow...`,
`examples.agentscope_frozenlake.workflow...`): run from the repository root, they resolve here."""
