"""A PNG of an HTML page (a plotly figure), rendered by headless Chromium from the system's packages
(`apt-get install chromium`), with what its console said. Run as `python benchmarks/<script>.py`, a script
finds this module beside it.

    python benchmarks/screenshot.py page.html out.png [--width 1400] [--height 560]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("no Chromium found: apt-get install chromium")


def screenshot(html: Path, png: Path, width: int, height: int, wait_ms: int = 3000) -> list[str]:
    """Render `html` at width x height into `png`; returns the console messages the page logged."""
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([browser(), *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                               f"--virtual-time-budget={wait_ms}", "--enable-logging=stderr", "--v=0",
                               f"--screenshot={png.resolve()}", html.resolve().as_uri()],
                              capture_output=True, text=True, timeout=120)
    if not png.exists():
        raise SystemExit(f"Chromium wrote no screenshot: {proc.stderr[-2000:]}")
    return [line for line in proc.stderr.splitlines() if "CONSOLE" in line]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("html")
    ap.add_argument("png")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=560)
    args = ap.parse_args()
    for line in screenshot(Path(args.html), Path(args.png), args.width, args.height):
        print(line)


if __name__ == "__main__":
    main()
