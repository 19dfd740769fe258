"""Text environments (`base.py`: the contract and the `ENV` registry) and three built-ins that
need nothing downloaded: `countdown_calculator`, `frozen_lake_text`, `guess_number`."""

from trinity.envs.base import ENV, TextEnv

__all__ = ["ENV", "TextEnv"]
