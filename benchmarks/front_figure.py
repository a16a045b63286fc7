"""The front figure of a study (what `ilr-search pareto --out FILE.html` draws), rendered by headless Chromium at
each width asked, with what the page's console said (it should say nothing).

    python benchmarks/front_figure.py --storage sqlite:///studies/ilr-search.db [--study NAME]
        [--widths 800,1600] [--out docs/pareto-default]

writes OUT-800.png, OUT-1600.png: one PNG a width, at the page's own height, of the page without the mode bar.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from screenshot import screenshot  # noqa: E402

from ilr_search.analysis.page import write_figure_html  # noqa: E402
from ilr_search.commands.report import front_figure  # noqa: E402
from ilr_search.commands.logs import quiet_optuna  # noqa: E402
from ilr_search.commands.studies import default_study  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--storage", required=True)
    ap.add_argument("--study", default=None)
    ap.add_argument("--widths", default="800,1600")
    ap.add_argument("--out", default="docs/pareto-default")
    args = ap.parse_args()
    quiet_optuna()
    study = args.study or default_study(args.storage)[0]
    fig = front_figure(study, args.storage)
    html = Path(tempfile.mkdtemp()) / "front.html"
    write_figure_html(fig, html, static=True)
    height = int(fig.layout.height or 1600)
    for width in (int(w) for w in args.widths.split(",")):
        png = Path(f"{args.out}-{width}.png")
        console = screenshot(html, png, width, height)
        print(f"{png}: {width}x{height}; console: {len(console)} message(s)")
        for line in console:
            print("  " + line)


if __name__ == "__main__":
    main()
