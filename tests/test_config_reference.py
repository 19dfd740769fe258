"""The generated parts of the docs are current: the key reference in docs/configuration.md (from
the schema) and the built-in pieces in docs/plugins.md (from the registries)."""

from pathlib import Path

from trinity.config.catalog import catalog_markdown
from trinity.config.reference import reference_markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def _cells() -> list[list[str]]:
    """Each row of the reference's tables: key path, type, default, state, description."""
    lines = reference_markdown().splitlines()
    return [[c.strip() for c in x.strip("|").split(" | ")] for x in lines if x.startswith("| `")]


def _rows() -> dict[str, list[str]]:
    """key path -> the other cells of its row."""
    return {cells[0].strip("`"): cells[1:] for cells in _cells()}


def _block(page: Path, marker: str) -> str:
    """The generated part of `page` between its `<!-- marker:start/end -->` lines."""
    text = page.read_text(encoding="utf-8")
    return text.split(f"<!-- {marker}:start -->\n", 1)[1].split(f"<!-- {marker}:end -->", 1)[0]


def test_the_docs_reference_is_current() -> None:
    assert _block(DOC, "reference") == reference_markdown(), (
        "docs/configuration.md is stale: run `python scripts/config_reference.py`"
    )


def test_rows_say_type_default_state_and_description() -> None:
    rows = _rows()
    # buffer.batch_size: Field(1, ge=1), docstring "Tasks per explore step (unit: tasks)."
    kind, default, state, about = rows["buffer.batch_size"]
    assert (kind, default, state) == ("int (≥ 1)", "`1`", "acted upon")
    assert "unit: tasks" in about
    # NotBuilt("saving the experience pipeline's input to a file or table"), default None
    assert rows["data_processor.experience_pipeline.input_save_path"][1:3] == [
        "`None`",
        "not built: saving the experience pipeline's input to a file or table",
    ]
    # model.external_model.enable: acted upon (mode bench)
    assert rows["model.external_model.enable"][1:3] == ["`False`", "acted upon"]
    # a key under a section reused elsewhere gets its state at this place (Inside)
    assert rows["buffer.explorer_input.taskset.capacity"][2].startswith("not applicable: ")
    assert rows["buffer.trainer_input.experience_buffer.capacity"][2] == "acted upon"


def test_every_key_has_one_row() -> None:
    from trinity.config.support import schema_paths

    rows = _rows()
    assert len(rows) == len(_cells())  # no key twice
    assert {"seed", "synchronizer.sync_style", "explorer.auxiliary_models[*].name"} <= set(rows)
    assert set(rows) <= set(schema_paths())


PLUGINS = DOC.with_name("plugins.md")


def test_the_docs_list_of_built_in_pieces_is_current() -> None:
    assert _block(PLUGINS, "builtins") == catalog_markdown(), (
        "docs/plugins.md is stale: run `python scripts/config_reference.py`"
    )


def test_the_list_names_each_piece_with_its_docstring_and_aliases_as_such() -> None:
    from trinity.rewards import REWARD_FN

    rows = {
        line.split(" | ")[0].strip("| `"): line.split(" | ")[1].rstrip(" |")
        for line in catalog_markdown().splitlines()
        if line.startswith("| `")
    }
    assert set(REWARD_FN.names()) <= set(rows)
    # arithmetic_reward's docstring starts '{"accuracy": 1.0} when the last number ...'
    assert rows["arithmetic_reward"].startswith('{"accuracy": 1.0} when the last number')
    # as_react_workflow is Trinity-RFT's name for agentscope_react_workflow (one class)
    assert rows["as_react_workflow"] == "the same as `agentscope_react_workflow`"


def test_a_plugin_registered_in_this_process_is_not_listed_as_built_in() -> None:
    from trinity.rewards import REWARD_FN

    # an installed package's piece, and a plugin directory's (imported under trinity.common.plugins)
    for name, module in [
        ("catalog_test_package_reward", "my_package.rewards"),
        ("catalog_test_plugin_reward", "trinity.common.plugins.my_plugins_0123456789.rewards"),
    ]:
        plugin = type(lambda: None)((lambda r, t: {}).__code__, {}, name)
        plugin.__module__ = module
        REWARD_FN.register(name)(plugin)
        try:
            assert name not in catalog_markdown()
        finally:
            REWARD_FN._items.pop(name)
