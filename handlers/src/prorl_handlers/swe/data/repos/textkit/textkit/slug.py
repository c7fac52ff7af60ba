"""URL slugs."""

from __future__ import annotations

import re
import unicodedata

_NON_WORD = re.compile(r"[^a-z0-9]+")


def slugify(text: str, separator: str = "-", max_length: int | None = None) -> str:
    """Lowercase ASCII slug of `text`: runs of other characters become one `separator`.

    Accents are removed ("Crème" -> "creme"). With `max_length`, the slug is cut to at most that
    many characters.
    """
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    slug = _NON_WORD.sub(separator, ascii_text.lower()).strip(separator)
    if max_length is not None:
        slug = slug[:max_length]
    return slug
