"""The live status page (`/admin/`) in a real browser: headless Chromium (Debian's) loads it
from a guard serving real traffic, with the admin token in the URL's fragment. The rendered
DOM has each tenant's floor and credits, the slots per backend, the §6 verdict, the four
charts (uPlot: time on the x axis) over a stated span, and each tenant's SLO attainment and
each class's lateness; the screenshot shows the charts' lines in their colours. Without
the token the page says why it has no data."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess

import aiohttp
import numpy as np
import pytest
from PIL import Image

from tests.integration.live import guard_config, token

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ADMIN = "admin-token-0123456789"

pytestmark = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("FLOORGUARD_REQUIRE_CHROMIUM"),
    reason="chromium is not installed (apt-get install chromium; .ci/run installs it)",
)


def _chromium(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--window-size=1200,1400", "--virtual-time-budget=6000", *args, url],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _colour_pixels(png, hex_colour: str) -> int:
    with Image.open(png) as image:
        rgb = np.asarray(image.convert("RGB")).astype(int)
    want = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(rgb - want).sum(axis=2) < 30).sum())


def test_the_status_page_renders_the_floor_queues_and_charts(live, tmp_path):
    backend = live.emulator()
    url, _ = live.guard(guard_config(backend, admin={"token": ADMIN}))

    async def traffic():
        async with aiohttp.ClientSession() as s:
            for second in range(3):
                posts = [
                    s.post(
                        url + "/v1/completions",
                        json={"model": "m", "prompt": "x", "max_tokens": 4},
                        headers={"Authorization": f"Bearer {token(tenant)}"},
                    )
                    for tenant in ["acme"] * 5 + ["free"] * 4
                ]
                for r in await asyncio.gather(*posts):
                    r.release()
                await asyncio.sleep(1.05 if second < 2 else 1.5)

    live.run(traffic())
    dom = _chromium(f"{url}/admin/#token={ADMIN}", "--dump-dom").stdout
    assert 'data-ready="1"' in dom, dom[-2000:]
    assert 'data-tenant="acme"' in dom and ">3<" in dom  # its floor B = 3
    assert "backend 0" in dom and "/ 4<" in dom  # in flight of its 4 slots
    assert 'id="region"' in dom
    for series in ("entitled", "surplus", "reject", "late", "attainment"):
        assert f'data-series="{series}"' in dom
    assert "from the floor: " in dom  # a legend total
    # time on the x axis: uPlot's charts (vendored, inlined), over a stated UTC span
    assert dom.count('class="uplot') == 4 and "<canvas" in dom
    span = re.search(r"from (\d\d:\d\d:\d\d) to (\d\d:\d\d:\d\d) UTC", dom)
    assert span is not None and span.group(1) < span.group(2), dom[-3000:]
    # per-tenant attainment: acme's floor-entitled requests, all on time on an idle backend
    row = re.search(r'<tr data-attainment="acme">(.*?)</tr>', dom)
    assert row is not None and "100.0 %" in row.group(1), dom[-3000:]
    assert 'data-class="assured"' in dom and 'data-class="opportunistic"' in dom

    png = tmp_path / "status.png"
    _chromium(f"{url}/admin/#token={ADMIN}", f"--screenshot={png}")
    with Image.open(png) as image:
        assert image.size == (1200, 1400)
    assert _colour_pixels(png, "#1a7f37") > 200  # the floor's admissions line, and "inside"
    assert _colour_pixels(png, "#0969da") > 200  # surplus line and slot bars

    refused = _chromium(f"{url}/admin/", "--dump-dom").stdout  # no token in the fragment
    assert "this path needs the admin token" in refused and 'data-ready="1"' not in refused
