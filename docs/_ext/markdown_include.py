"""``.. markdown-include:: <path>``: a Markdown file of the repository rendered as HTML in place.

The user guides are the repository's own Markdown files (README, docs/*.md), so GitHub and the
built documentation show the same text. Links between them are pointed at their guide pages.
"""
from __future__ import annotations

import re
from pathlib import Path

import markdown
from docutils import nodes
from docutils.parsers.rst import Directive

#: Markdown files that have a guide page: links to them go to that page.
GUIDES = {
    "README.md": "readme.html",
    "migrating.md": "migrating.html",
    "distributed.md": "distributed.html",
    "errors.md": "errors.html",
    "architecture.md": "architecture.html",
    "CONTRIBUTING.md": "contributing.html",
}
_LINK = re.compile(r'href="(?:[./]*?)(?:docs/)?([\w-]+\.md)(#[^"]*)?"')


class MarkdownInclude(Directive):
    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        env = self.state.document.settings.env
        path = (Path(self.state.document.current_source).parent / self.arguments[0]).resolve()
        if not path.is_file():
            raise self.severe(f"markdown-include: {path} not found")
        env.note_dependency(str(path))
        html = markdown.markdown(path.read_text(encoding="utf-8"), extensions=["tables", "fenced_code", "toc"])

        def relink(match: re.Match) -> str:
            page = GUIDES.get(match.group(1))
            return f'href="{page}{match.group(2) or ""}"' if page else match.group(0)

        return [nodes.raw("", _LINK.sub(relink, html), format="html")]


def setup(app):  # noqa: ANN001, ANN201 (Sphinx's extension entry point)
    app.add_directive("markdown-include", MarkdownInclude)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
