import json


def init_configs(args: list[str]) -> dict:
    """The recipe file after `--config` (the worker writes it as JSON)."""
    return json.load(open(args[args.index("--config") + 1]))
