"""The configuration reference in docs/configuration.md is generated from the schema and current."""

from pathlib import Path

from trinity.config.reference import reference_markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def _cells() -> list[list[str]]:
    """Each row of the reference's tables: key path, type, default, state, description."""
    lines = reference_markdown().splitlines()
    return [[c.strip() for c in x.strip("|").split(" | ")] for x in lines if x.startswith("| `")]


def _rows() -> dict[str, list[str]]:
    """key path -> the other cells of its row."""
    return {cells[0].strip("`"): cells[1:] for cells in _cells()}


def test_the_docs_reference_is_current() -> None:
    text = DOC.read_text(encoding="utf-8")
    block = text.split("<!-- reference:start -->\n", 1)[1].split("<!-- reference:end -->", 1)[0]
    assert block == reference_markdown(), (
        "docs/configuration.md is stale: run `python scripts/config_reference.py`"
    )


def test_rows_say_type_default_state_and_description() -> None:
    rows = _rows()
    # buffer.batch_size: Field(1, ge=1), docstring "Tasks per explore step (unit: tasks)."
    kind, default, state, about = rows["buffer.batch_size"]
    assert (kind, default, state) == ("int (≥ 1)", "`1`", "acted upon")
    assert "unit: tasks" in about
    # model.lora_configs: Annotated[..., NotBuilt("LoRA")] = None
    assert rows["model.lora_configs"][1:3] == ["`None`", "not built: LoRA"]
    # a key under a section reused elsewhere gets its state at this place (Inside)
    assert rows["buffer.explorer_input.taskset.capacity"][2].startswith("not applicable: ")
    assert rows["buffer.trainer_input.experience_buffer.capacity"][2] == "acted upon"


def test_every_key_has_one_row() -> None:
    from trinity.config.support import schema_paths

    rows = _rows()
    assert len(rows) == len(_cells())  # no key twice
    assert {"seed", "synchronizer.sync_style", "explorer.auxiliary_models[*].name"} <= set(rows)
    assert set(rows) <= set(schema_paths())
