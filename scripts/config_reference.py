"""Rewrite the generated configuration reference in docs/configuration.md.

    python scripts/config_reference.py          # after changing a field of trinity/config/

The part between `<!-- reference:start -->` and `<!-- reference:end -->` is
`trinity.config.reference.reference_markdown()`; `tests/test_config_reference.py` fails while the
page differs from it.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trinity.config.reference import reference_markdown  # noqa: E402

DOC = ROOT / "docs" / "configuration.md"
START, END = "<!-- reference:start -->\n", "<!-- reference:end -->"


def main() -> None:
    text = DOC.read_text(encoding="utf-8")
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    DOC.write_text(f"{head}{START}{reference_markdown()}{END}{tail}", encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
