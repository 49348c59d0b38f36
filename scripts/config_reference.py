"""Rewrite docs/config.md from the configuration models (floorguard.proxy.config.doc)."""

from pathlib import Path

from floorguard.proxy.config.doc import config_reference

page = Path(__file__).parents[1] / "docs" / "config.md"
page.write_text(config_reference(), encoding="utf-8")
print(f"wrote {page}")
