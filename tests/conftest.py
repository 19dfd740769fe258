"""Shared fixtures: a tiny model built once per session, offline."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from trinity.models import create_tiny_model

    return create_tiny_model(tmp_path_factory.mktemp("models") / "tiny", preset="1m", seed=0)
