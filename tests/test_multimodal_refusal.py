"""Images and videos are refused by name, with the reason (docs/data.md, 'Multi-modal data')."""

from __future__ import annotations

from trinity.config.schema import TrinityConfig
from trinity.config.support import not_built_problems


def test_image_and_video_keys_are_refused_with_the_reason():
    taskset = {"path": "t", "format": {"image_key": "images", "video_key": "videos"}}
    cfg = TrinityConfig.model_validate({"buffer": {"explorer_input": {"taskset": taskset}}})
    probs = {p.path: p.message for p in not_built_problems(cfg)}
    at = "buffer.explorer_input.taskset.format."
    assert set(probs) == {at + "image_key", at + "video_key"}
    assert probs[at + "image_key"].startswith("not built yet: multi-modal data (images): ")
    assert "pixel values and M-RoPE positions" in probs[at + "video_key"]
