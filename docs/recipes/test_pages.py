"""Every code block on a recipe page is a file the tests run: each fenced block follows a
`<!-- file: NAME -->` line and is that file's whole text, byte for byte."""

from __future__ import annotations

import re

from conftest import HERE

PAGES = [
    "claude-desktop-and-code.md",
    "langchain.md",
    "openai-agents.md",
    "python-tool-loop.md",
    "typescript-mcp.md",
]
BLOCK = re.compile(r"^```[^\n]*\n(.*?)^```\n", re.S | re.M)
MARKED = re.compile(r"^<!-- file: (\S+) -->\n```[^\n]*\n(.*?)^```\n", re.S | re.M)


def test_every_block_on_every_page_is_a_tested_file() -> None:
    for page in PAGES:
        text = (HERE / page).read_text()
        blocks = BLOCK.findall(text)
        marked = MARKED.findall(text)
        assert blocks, f"{page} shows no code"
        assert len(marked) == len(blocks), f"{page}: a code block without <!-- file: NAME -->"
        for name, body in marked:
            assert body == (HERE / name).read_text(), f"{page}: the block of {name} differs"
