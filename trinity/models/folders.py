"""Model folders built once and published atomically (`tiny://` builds, GGUF imports)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def build_folder(
    out: Path, build: Callable[[Path], None], is_done: Callable[[Path], bool], overwrite: bool
) -> Path:
    """Build a folder at `out` with `build(tmp)`, so that readers never see a half-written one:

    1. an existing finished folder (`is_done(out)`) is returned as is; anything else but an
       empty folder raises FileExistsError unless `overwrite`
    2. build in a private temp folder beside `out`
    3. rename it into place (atomic); a build that lost a race to an identical one (the folder
       appeared meanwhile and `is_done`) is discarded
    """
    # 1.
    if out.exists() and not (out.is_dir() and not any(out.iterdir())) and not overwrite:
        if is_done(out):
            return out
        raise FileExistsError(f"{out} already exists (pass overwrite=True to replace it)")
    # 2.
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        build(tmp)
        # 3.
        if out.exists() and overwrite:
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / out.name)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, out)
        except OSError:
            if is_done(out):  # a concurrent build won the race
                return out
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
