"""Trinity-RFT's own examples (tests/data/trinity_examples/, v0.5.2), each on a tiny model and
generated data (tests/trinity_examples.py): the fast checks validate every one and compare with
the table of what each does here (EXPECTED); the slow walker runs 2 steps of every example that
validates, `trinity run` as a user runs it. docs/examples.md is generated from the same table."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from trinity_examples import (
    DJ_RECIPE,
    ENDPOINT_UNREACHABLE,
    EXAMPLES,
    EXPECTED,
    NEEDS_SERVER,
    RUNS,
    example_names,
    examples_table,
    problems_of,
    substitute,
)

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [n for n in example_names() if n != DJ_RECIPE]
RUNNABLE = [n for n in CONFIGS if EXPECTED[n] == RUNS]


def test_the_table_names_every_example_file():
    assert len(example_names()) == 60  # 54 examples, 5 benchmark templates, 1 recipe
    assert sorted(EXPECTED) == example_names()


def test_the_data_juicer_recipe_is_not_a_trinity_config():
    from trinity.config import ConfigError, load_config

    recipe = yaml.safe_load((EXAMPLES / DJ_RECIPE).read_text())
    assert "process" in recipe and "model" not in recipe  # Data-Juicer's keys
    with pytest.raises(ConfigError, match="process"):
        load_config(EXAMPLES / DJ_RECIPE)


@pytest.mark.parametrize("name", CONFIGS)
def test_an_example_validates_or_is_refused_by_name(name, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    sub = substitute(name, tmp_path)
    for key, value in sub.env.items():
        monkeypatch.setenv(key, value)
    found = problems_of(sub)
    expected = EXPECTED[name]
    if expected == RUNS and name in NEEDS_SERVER:  # no server in a fast test: only that
        assert len(found) == 1 and ENDPOINT_UNREACHABLE in found[0], found
    elif expected == RUNS:
        assert found == []
    elif expected.startswith("refused:"):
        assert found and all("not built" in p for p in found), found
    else:  # needs: a package this Python lacks, which the problem names
        assert expected.startswith("needs:")
        assert found and all("pip install" in p for p in found), found


def test_the_docs_table_is_current(tmp_path):
    doc = (ROOT / "docs" / "examples.md").read_text()
    assert doc == examples_table(tmp_path), "run: PYTHONPATH=. python scripts/examples_table.py"
