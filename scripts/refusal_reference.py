"""Rewrite docs/trace.md's refusal table from the one refusal table (floorguard.core.refusals)."""

from pathlib import Path

from floorguard.core.refusals import trace_table

START, END = "<!-- refusal table: generated -->\n", "<!-- refusal table: end -->"
page = Path(__file__).parents[1] / "docs" / "trace.md"
text = page.read_text(encoding="utf-8")
head, rest = text.split(START)
page.write_text(head + START + trace_table() + END + rest.split(END, 1)[1], encoding="utf-8")
print(f"wrote {page}")
