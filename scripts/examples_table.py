"""Write docs/examples.md: Trinity-RFT's examples, which run here and which are refused, and why
(from tests/trinity_examples.py; tests/test_trinity_examples.py checks the file matches).

    PYTHONPATH=. python scripts/examples_table.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from trinity_examples import examples_table  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (ROOT / "docs" / "examples.md").write_text(examples_table(Path(tmp)))


if __name__ == "__main__":
    main()
