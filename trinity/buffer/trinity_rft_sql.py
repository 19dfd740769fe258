"""Reading a table Trinity-RFT's SQL storage wrote, as our Experiences.

    experiences = read_trinity_rft_table("sqlite:///old_run.db", "exp_buffer", "experience")

Trinity-RFT keeps one table per buffer, named after it (`buffer.trainer_input.experience_buffer.
name`), with a layout per `schema_type`, and each row's experience serialised in
`experience_bytes`:

- experience: id, timestamp, task_id, run_id, msg_id, model_version, experience_bytes, reward,
  consumed (how often a reader took the row);
- sft: id, message_list, experience_bytes;
- dpo: id, chosen_message_list, rejected_message_list, experience_bytes.

`experience_bytes` is `b"TRXP"`, a format version byte (1), the lengths of two parts (8 bytes
each, little-endian), then a pickled dict of the scalar fields (`items`: one dict per experience)
and a safetensors blob of the tensors, keyed `<item>:<field>`. The pickle is read with an
unpickler that builds only plain Python values (dicts, lists, strings, numbers), never a class;
rows in Trinity-RFT's older form (a whole pickled Experience object) are refused, naming the row.

How a row maps to ours: tokens, prompt_length, logprobs, action_mask, advantages, returns and
token-level rewards as they are; `reward` and `model_version` from the row's columns (which
Trinity-RFT's reader also prefers); `truncated` when a truncation status is set; the EID's batch
and task as numbers (a text id becomes a stable number, the text kept in `info`), its random
`suffix` moved to `info["msg_id"]` (ours groups by suffix); messages kept in `info`. An SFT row is
one experience of kind sft; a DPO row (prompt tokens plus chosen and rejected reply tokens) is our
pair: [prompt + chosen, prompt + rejected] of kind dpo with `EID.run` 0 and 1.
"""

from __future__ import annotations

import io
import pickle
import struct
import zlib
from typing import Any

import sqlalchemy as sa

from trinity.buffer.sql_url import database_url
from trinity.common.experience import Experience, ExperienceKind

MAGIC, VERSION = b"TRXP", 1
SCHEMA_TYPES = ("experience", "sft", "dpo")


class _PlainUnpickler(pickle.Unpickler):
    """Builds plain values only: any class reference in the data is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a database row")


def decode_items(data: bytes) -> list[dict[str, Any]]:
    """The experiences in one `experience_bytes` value: per item, its scalar fields plus its
    tensors as lists (`tensors`: field -> list)."""
    if not data.startswith(MAGIC):
        raise ValueError(
            "not Trinity-RFT's TRXP serialisation (an older row: a pickled Experience object, "
            "which is not loaded here)"
        )
    at = len(MAGIC)
    (version,) = struct.unpack_from("<B", data, at)
    if version != VERSION:
        raise ValueError(f"TRXP version {version}; this reader reads version {VERSION}")
    meta_len, tensor_len = struct.unpack_from("<QQ", data, at + 1)
    at += 17
    metadata = _PlainUnpickler(io.BytesIO(data[at : at + meta_len])).load()
    from safetensors.numpy import load

    tensors = load(data[at + meta_len : at + meta_len + tensor_len])
    items = []
    for index, item in enumerate(metadata["items"]):
        prefix = f"{index}:"
        item = dict(item)
        item["tensors"] = {
            key[len(prefix) :]: value.tolist()
            for key, value in tensors.items()
            if key.startswith(prefix) and key.count(":") == 1
        }
        items.append(item)
    return items


def _number(value: Any, info: dict[str, Any], key: str) -> int:
    """An EID part as our int: a number as it is, '' as 0, other text as a stable number (the
    text kept in `info[key]`)."""
    if isinstance(value, int):
        return value
    text = str(value)
    if text.lstrip("-").isdigit():
        return int(text)
    if text:
        info[key] = text
        return zlib.crc32(text.encode())
    return 0


def _experience(item: dict[str, Any], **override: Any) -> Experience:
    t = item["tensors"]
    info = dict(item.get("info") or {})
    eid = dict(item.get("eid") or {})
    if eid.get("suffix"):
        info["msg_id"] = eid["suffix"]
    for key in ("messages", "tools", "truncate_status"):
        if item.get(key) is not None:
            info[key] = item[key]
    tokens = override.pop("tokens", t["tokens"])
    prompt_length = override.pop("prompt_length", item.get("prompt_length", 1))
    response = len(tokens) - prompt_length
    mask = t.get("action_mask")
    d = {
        "tokens": [int(x) for x in tokens],
        "prompt_length": prompt_length,
        "logprobs": t.get("logprobs"),
        "action_mask": mask if mask is not None and len(mask) == response else None,
        "reward": item.get("reward"),
        "token_level_reward": t.get("token_level_reward"),
        "advantages": t.get("advantages"),
        "returns": t.get("returns"),
        "eid": {
            "batch": _number(eid.get("batch", 0), info, "trinity_rft_batch"),
            "task": _number(eid.get("task", 0), info, "trinity_rft_task"),
            "run": int(eid.get("run") or 0),
            "step": int(eid.get("step") or 0),
        },
        "truncated": item.get("truncate_status") is not None,
        "prompt_text": item.get("prompt_text"),
        "response_text": item.get("response_text"),
        "info": info,
        "metrics": dict(item.get("metrics") or {}),
    }
    if mask is not None and all(mask) and "kind" not in override:
        d["kind"] = ExperienceKind.SINGLE_TURN.value
    elif mask is not None and "kind" not in override:
        d["kind"] = ExperienceKind.MULTI_TURN.value
    for key, value in override.items():
        if key == "eid":
            d["eid"] = {**d["eid"], **value}
        else:
            d[key] = value
    return Experience.from_dict(d)


def row_experiences(row: Any, schema_type: str) -> list[Experience]:
    """Our experiences of one row of a Trinity-RFT table of `schema_type` (module doc)."""
    out = []
    for item in decode_items(bytes(row.experience_bytes)):
        t = item["tensors"]
        if schema_type == "experience":
            version = row.model_version if row.model_version is not None else 0
            reward = row.reward if row.reward is not None else item.get("reward")
            out.append(_experience(item, model_version=int(version), reward=reward))
        elif schema_type == "sft":
            out.append(_experience(item, kind=ExperienceKind.SFT.value))
        else:  # dpo: the prompt in `tokens`, the replies in `chosen` and `rejected`
            prompt = [int(x) for x in t["tokens"]]
            for run, reply in enumerate((t["chosen"], t["rejected"])):
                out.append(
                    _experience(
                        item,
                        tokens=prompt + [int(x) for x in reply],
                        prompt_length=len(prompt),
                        kind=ExperienceKind.DPO.value,
                        logprobs=None,
                        action_mask=None,
                        eid={"task": int(row.id), "run": run},
                    )
                )
    return out


def read_trinity_rft_table(
    path: str, table: str, schema_type: str = "experience", after: int = 0,
    limit: int | None = None,
) -> list[Experience]:  # fmt: skip
    """The experiences of table `table` (Trinity-RFT's layout for `schema_type`: experience,
    sft or dpo) in the database `path` (a SQLite file or URL), rows with id above `after` in id
    order, at most `limit` rows. Raises ValueError naming a row that cannot be read."""
    if schema_type not in SCHEMA_TYPES:
        raise ValueError(f"schema_type {schema_type!r}: one of {', '.join(SCHEMA_TYPES)}")
    engine = sa.create_engine(database_url(path))
    try:
        t = sa.Table(table, sa.MetaData(), autoload_with=engine)
        q = sa.select(t).where(t.c.id > after).order_by(t.c.id)
        if limit is not None:
            q = q.limit(limit)
        with engine.connect() as conn:
            rows = conn.execute(q).all()
    finally:
        engine.dispose()
    out: list[Experience] = []
    for row in rows:
        try:
            out += row_experiences(row, schema_type)
        except (ValueError, KeyError, pickle.UnpicklingError) as e:
            raise ValueError(f"{table} row {row.id}: {e}") from None
    return out
