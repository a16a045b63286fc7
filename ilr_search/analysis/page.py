"""A figure as one self-contained HTML page that works offline: the figure's JSON and plotly.js, embedded once,
gzipped, unzipped by the browser and drawn at the page's width."""

from __future__ import annotations

import base64
import gzip
import html
import json
import re
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

# plotly.js's cartesian bundle (scatter, bar and heatmap traces: all the figure draws), as the npm registry's
# plotly.js-cartesian-dist-min ships it, gzipped; its LICENSE beside it. A page embeds it where plotly.py draws for
# the same plotly.js version, else the full bundle plotly.py ships (gzipped as the page is written).
PLOTLY_BUNDLE = Path(__file__).with_name("plotlyjs") / "plotly-cartesian.min.js.gz"
PLOTLY_BUNDLE_VERSION = "4.1.1"
PLOTLY_BUNDLE_SHA256 = "79542150855a52c567260e3137095dbe2b744e6d702a5cabe67da246942fba7a"  # of the .js unzipped

# The page: the figure's JSON, plotly.js gzipped in base64, and a script that unzips it with the browser's own
# DecompressionStream (nothing is fetched) and draws the figure at the page's width.
PAGE = """<!DOCTYPE html>
<html>
<head><meta charset="utf-8"><title>{title}</title></head>
<body style="margin:0">
<div id="figure" style="width:100%;height:{height}px"><noscript>the figure needs JavaScript</noscript></div>
<script type="application/json" id="figure-json">{figure}</script>
<script type="text/plain" id="plotly-js-gzip-base64">{plotly}</script>
<script>
(async function () {{
  var box = document.getElementById("figure");
  try {{
    var packed = atob(document.getElementById("plotly-js-gzip-base64").textContent.trim());
    var bytes = new Uint8Array(packed.length);
    for (var i = 0; i < packed.length; i++) bytes[i] = packed.charCodeAt(i);
    var unzipped = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    var library = document.createElement("script");
    library.text = await new Response(unzipped).text();
    document.head.appendChild(library);
    var figure = JSON.parse(document.getElementById("figure-json").textContent);
    Plotly.newPlot(box, figure.data, figure.layout, {config});
  }} catch (e) {{
    box.textContent = "this page draws its figure with plotly.js, embedded gzipped: it needs a browser with " +
      "DecompressionStream (Chrome 80, Firefox 113, Safari 16.4 or later) (" + e + ")";
  }}
}})();
</script>
</body>
</html>
"""


def plotly_gzip() -> bytes:
    """plotly.js, gzipped: the cartesian bundle beside this module where plotly.py draws for its version, else the
    full bundle plotly.py ships."""
    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    if get_plotlyjs_version() == PLOTLY_BUNDLE_VERSION and PLOTLY_BUNDLE.exists():
        return PLOTLY_BUNDLE.read_bytes()
    return gzip.compress(get_plotlyjs().encode("utf-8"), 9, mtime=0)


def figure_page(fig: go.Figure, static: bool = False) -> str:
    """The figure as one self-contained HTML page (PAGE: plotly.js embedded once, gzipped; nothing fetched) at the
    page's width. `static`: for a screenshot, without plotly's toolbar (the mode bar)."""
    import plotly.io as pio

    config: dict[str, Any] = {"responsive": True} | ({"displayModeBar": False} if static else {})
    figure = pio.to_json(fig, validate=False).replace("</", "<\\/")  # no "</script>" inside the script
    title = html.escape(re.sub(r"<[^>]+>", " ", str(fig.layout.title.text or "figure")).split("  ")[0].strip())
    return PAGE.format(
        title=title,
        height=int(fig.layout.height or 600),
        figure=figure,
        plotly=base64.b64encode(plotly_gzip()).decode("ascii"),
        config=json.dumps(config),
    )


def write_figure_html(fig: go.Figure, path: str | Path, static: bool = False) -> None:
    """Write figure_page(fig, static) to `path`."""
    Path(path).write_text(figure_page(fig, static), encoding="utf-8")
