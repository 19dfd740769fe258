"""Secrets in a config (an API key) stay out of everything a config is shown or sent as.

`trinity validate` prints the effective config, `trinity run` hands it to the monitor backends
(wandb, mlflow, swanlab, TensorBoard's text) as the run's config: `redacted` replaces the value
of every key named as a secret, at any depth (`monitor.monitor_args` and workflow args are free
dicts, so a name is all there is to go by).
"""

from __future__ import annotations

from typing import Any

SECRET_NAMES = frozenset(
    {"api_key", "apikey", "access_token", "auth_token", "password", "secret", "secret_key", "token"}
)
REDACTED = "<redacted>"


def redacted(data: Any) -> Any:
    """`data` (a config's JSON dump, or any part of one) with every secret's value replaced by
    `REDACTED` (unset ones, None, left as they are)."""
    if isinstance(data, dict):
        return {
            k: REDACTED if _secret(k) and data[k] is not None else redacted(v)
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [redacted(v) for v in data]
    return data


def _secret(key: Any) -> bool:
    return isinstance(key, str) and key.lower().replace("-", "_") in SECRET_NAMES
