"""The text of sampled tokens, a token at a time, inside the engine's decode loop.

    texts = RowTexts(tokenizer, rows=range(8), stops=("\\nUser:",))
    added, hits = texts.step([0, 3, 5], [tok0, tok3, tok5])   # per live row, each decode step

Two things need a reply's text while it is sampled: stop strings, which end a row at the token
that completes one (rather than sampling on to `max_tokens` and cutting after), and streamed
replies, whose text goes out as it comes. Decoding each row's whole prefix at every step is
O(n²) per row; a `TextStream` adds each token's text in O(1): `tokenizers`' `DecodeStream` on a
fast tokenizer's backend, else a window of the last few tokens re-decoded (the same cost, any
tokenizer). A character whose bytes span tokens appears once its last byte is sampled, so the
joined pieces are always a prefix of `tokenizer.decode(tokens, skip_special_tokens=True)`, the
text a finished reply is returned as.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

REPLACEMENT = "\ufffd"  # what decode shows for a character whose bytes are not all there


class TextStream:
    """One row's text, a token at a time (module doc)."""

    def __init__(self, tokenizer: Any) -> None:
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._tokenizer = tokenizer
        if self._backend is not None:
            from tokenizers.decoders import DecodeStream

            self._stream = DecodeStream(skip_special_tokens=True)
        else:  # a window of tokens: those already shown as text, then those not yet
            self._ids: list[int] = []
            self._shown_from = self._unshown_from = 0

    def step(self, token_id: int) -> str:
        """The text `token_id` adds ("" while a character is incomplete)."""
        if self._backend is not None:
            return self._stream.step(self._backend, token_id) or ""
        self._ids.append(token_id)
        decode = self._tokenizer.decode
        shown = decode(self._ids[self._shown_from : self._unshown_from], skip_special_tokens=True)
        text = decode(self._ids[self._shown_from :], skip_special_tokens=True)
        if len(text) <= len(shown) or text.endswith(REPLACEMENT):
            return ""
        self._shown_from, self._unshown_from = self._unshown_from, len(self._ids)
        return text[len(shown) :]


class RowTexts:
    """The texts of a batch's rows that stream or may end at a stop string (module doc)."""

    def __init__(self, tokenizer: Any, rows: Iterable[int], stops: tuple[str, ...]) -> None:
        self.streams = {r: TextStream(tokenizer) for r in rows}
        self.stops = tuple(s for s in stops if s)
        # a stop string may start in text already seen: keep that much of it
        self._keep = max((len(s) for s in self.stops), default=1) - 1
        self._tails = dict.fromkeys(self.streams, "")

    def step(self, rows: list[int], tokens: list[int]) -> tuple[dict[int, str], dict[int, str]]:
        """Each row's next token (`rows[i]` sampled `tokens[i]`): (the text it adds, per row
        this object follows; the stop string it completes, per row that completes one, the
        earliest in its text when it completes several)."""
        added: dict[int, str] = {}
        hits: dict[int, str] = {}
        for row, token in zip(rows, tokens, strict=True):
            stream = self.streams.get(row)
            if stream is None:
                continue
            text = added[row] = stream.step(token)
            if not self.stops or not text:
                continue
            tail = self._tails[row] + text
            found = [(tail.find(s), s) for s in self.stops if s in tail]
            if found:
                hits[row] = min(found)[1]
            self._tails[row] = tail[-self._keep :] if self._keep else ""
        return added, hits
