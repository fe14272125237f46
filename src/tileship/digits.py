"""Whole numbers written in ASCII digits, as headers, CLI lists and path suffixes give them.

``str.isdigit`` also accepts other scripts' digits and superscripts ("²", "١"), which ``int``
then refuses or reads as another number: every such check goes through ``parse_uint`` instead.
"""

from __future__ import annotations

import re

_UINT = re.compile(r"[0-9]{1,18}")


def parse_uint(text: str | None, *, strip: bool = False) -> int | None:
    """The value of ``text`` when it is 1 to 18 ASCII digits (after removing spaces and tabs at
    both ends with ``strip``: an HTTP header's optional whitespace), else None. Never raises."""
    if not isinstance(text, str):
        return None
    if strip:
        text = text.strip(" \t")
    return int(text) if _UINT.fullmatch(text) else None


__all__ = ["parse_uint"]
