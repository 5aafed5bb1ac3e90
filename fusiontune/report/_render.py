"""Render a report document, a list of blocks, as markdown and as one self-contained HTML page.

A block is ``("h1" | "h2" | "p" | "pre", text)``, ``("table", headers, rows)`` or
``("img", alt, png_path)``. Paragraphs and cells may hold inline ``code`` in backquotes. The
markdown links the PNG files written beside it; the HTML embeds them as base64.
"""

from __future__ import annotations

import base64
import html
import re
from typing import Any

# ("h1" | "h2" | "p" | "pre", text) | ("table", headers, rows) | ("img", alt, png_path)
Block = tuple[Any, ...]


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(doc: list[Block]) -> str:
    """Render a document (a list of blocks) as GitHub-flavoured markdown."""
    out: list[str] = []
    for block in doc:
        kind = block[0]
        if kind in ("h1", "h2"):
            out.append(("# " if kind == "h1" else "## ") + block[1])
        elif kind == "p":
            out.append(block[1])
        elif kind == "pre":
            out.append(f"```\n{block[1]}\n```")
        elif kind == "img":
            out.append(f"![{block[1]}]({block[2].name})")
        elif kind == "table":
            headers, rows = block[1], block[2]
            lines = ["| " + " | ".join(map(_md_cell, headers)) + " |", "|" + "---|" * len(headers)]
            lines += ["| " + " | ".join(map(_md_cell, r)) + " |" for r in rows]
            out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"


def _inline(text: str) -> str:
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(str(text), quote=False))


_CSS = (
    "body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}"
    "pre{background:#f6f6f6;padding:.8em;overflow-x:auto}img{max-width:100%}"
)


def to_html(doc: list[Block], title: str) -> str:
    """Render a document as one self-contained HTML page (plots embedded as base64 PNG)."""
    out = [
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_CSS}</style></head><body>"
    ]
    for block in doc:
        kind = block[0]
        if kind in ("h1", "h2", "p"):
            out.append(f"<{kind}>{_inline(block[1])}</{kind}>")
        elif kind == "pre":
            out.append(f"<pre>{html.escape(block[1])}</pre>")
        elif kind == "img":
            data = base64.b64encode(block[2].read_bytes()).decode("ascii")
            out.append(
                f'<figure><img alt="{html.escape(block[1])}" src="data:image/png;base64,{data}">'
                f"<figcaption>{html.escape(block[1])}</figcaption></figure>"
            )
        elif kind == "table":
            head = "".join(f"<th>{_inline(h)}</th>" for h in block[1])
            body = "".join(
                "<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in block[2]
            )
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    return "\n".join(out) + "\n</body></html>\n"
