"""A step report's figures as Markdown images (data URIs), for the Dagster partition's
metadata: read from the written page, so nothing is drawn twice and no figure library is
needed where Dagster runs."""

from __future__ import annotations

import base64
import re
from pathlib import Path

# The figures the partition shows, from the page's `<figure id=...>` elements.
SHOWN = ("rewards", "lengths", "ranks")
_FIGURE = re.compile(r'<figure id="([a-z-]+)">(<svg.*?</svg>)', re.DOTALL)


def figures_markdown(page: Path, link: str | None = None, shown: tuple[str, ...] = SHOWN) -> str:
    """Markdown with the page's figures named in `shown` as inline SVG images, and a line
    naming the page (a link to `link` where it is served over http); a page that cannot be
    read gives that line alone."""
    try:
        text = page.read_text()
    except (OSError, UnicodeDecodeError):
        return f"The report `{page}` could not be read."
    found = dict(_FIGURE.findall(text))
    images = [
        f"![{name}](data:image/svg+xml;base64,{base64.b64encode(found[name].encode()).decode()})"
        for name in shown
        if name in found
    ]
    where = (
        f"[{page}]({link})" if link and link.startswith(("http://", "https://")) else f"`{page}`"
    )
    return "\n\n".join([*images, f"The whole report: {where}"])
