"""Form bodies (``application/x-www-form-urlencoded``) split into pairs, cheaply.

The enqueue path parses one form per task; ``urllib.parse.parse_qsl`` spent ~6% of a
node's CPU under ``scripts/bench.py`` on its generic layers and on decoding the same
percent-encoded target URL again and again. ``form_pairs`` gives the same answer on every
input (tests/unit/tasks/test_formdata.py checks it against parse_qsl, errors included).
"""

from __future__ import annotations

from urllib.parse import unquote

_UNQUOTED: dict[str, str] = {}  # percent-encoded form values seen (the same URL, mostly)
_MAX_UNQUOTED, _MAX_UNQUOTED_LEN = 1024, 512  # ~0.5 MB at most; once full, no more are kept


def form_pairs(text: str, max_fields: int) -> list[tuple[str, str]]:
    """``parse_qsl(text, keep_blank_values=True, max_num_fields=max_fields,
    errors="strict")``, at a third of its cost per task (it was ~6% of a node's CPU):
    the same split, and short percent-encoded values decoded once and remembered."""
    if text and text.count("&") >= max_fields:
        raise ValueError("Max number of fields exceeded")
    pairs = []
    for part in text.split("&"):
        if not part:
            continue
        key, _, value = part.partition("=")
        pairs.append((_unquote_plus(key), _unquote_plus(value)))
    return pairs


def _unquote_plus(s: str) -> str:
    if "+" in s:
        s = s.replace("+", " ")
    if "%" not in s:
        return s
    out = _UNQUOTED.get(s)
    if out is None:
        out = unquote(s, errors="strict")
        if len(s) <= _MAX_UNQUOTED_LEN and len(_UNQUOTED) < _MAX_UNQUOTED:
            _UNQUOTED[s] = out
    return out
