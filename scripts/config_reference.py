"""Rewrite the generated parts of the docs: the key reference and the built-in pieces.

    python scripts/config_reference.py    # after changing a config field or a registered piece

docs/configuration.md between `<!-- reference:start -->` and `<!-- reference:end -->` is
`trinity.config.reference.reference_markdown()`; docs/plugins.md between `<!-- builtins:start -->`
and `<!-- builtins:end -->` is `trinity.config.catalog.catalog_markdown()`.
`tests/test_config_reference.py` fails while a page differs from what it is generated from.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trinity.config.catalog import catalog_markdown  # noqa: E402
from trinity.config.reference import reference_markdown  # noqa: E402

PARTS = (  # (page, marker name, what fills it)
    (ROOT / "docs" / "configuration.md", "reference", reference_markdown),
    (ROOT / "docs" / "plugins.md", "builtins", catalog_markdown),
)


def main() -> None:
    for doc, marker, make in PARTS:
        start, end = f"<!-- {marker}:start -->\n", f"<!-- {marker}:end -->"
        head, rest = doc.read_text(encoding="utf-8").split(start, 1)
        tail = rest.split(end, 1)[1]
        doc.write_text(f"{head}{start}{make()}{end}{tail}", encoding="utf-8")
        print(f"wrote {doc.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
