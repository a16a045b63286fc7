"""The block heatmap: a block search's (start, end) grid of loss differences to the plain model, as the figure's first
panels (one per repeat count) and as `pareto --view blocks`. Its cells are checked against a real frozen block study
of the tiny pretrained checkpoint (conftest.recurrent_checkpoint), whose race compares a few blocks with the plain
model on held-out window chunks; the grid of synthetic results checks the knob panels and the colour's clip; a
synthetic 30-layer study bounds the page's size; headless Chromium, where installed, draws the page offline."""

import base64
import gzip
import hashlib
import json
import math
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import optuna
import plotly.graph_objects as go
import pytest
from conftest import assert_one_line_error, frozen_run_args, one_core, run_cli, write_space

from ilr_search.analysis.answer import Answer
from ilr_search.analysis.blocks import (
    MARKS,
    NOT_RACED,
    RACED,
    SCREEN,
    BlockPlace,
    block_grid,
    block_place,
)
from ilr_search.analysis.page import PLOTLY_BUNDLE, PLOTLY_BUNDLE_SHA256, PLOTLY_BUNDLE_VERSION, figure_page
from ilr_search.analysis.plots import PlottedTrial, log_axis, pareto_figure
from ilr_search.analysis.race_core import Comparison, RaceSettings, RaceState, race_result
from ilr_search.analysis.race_report import RaceReport
from ilr_search.analysis.results import FrontRow
from ilr_search.storage.store import Run

PLAIN = "1,1,1,1"
BLOCKS = {
    "noise_seeds": 0,
    "families": ["blocks"],
    "max_reuse": 3,
    "n_trials": 10,
    "race_seeds": 3,
    "max_seeds": 5,
    "race_contenders": 3,
    "enqueue_paper_maps": False,
}
MAX_PAGE_BYTES = 1_500_000  # a 30-layer block study's page


@pytest.fixture(scope="module")
def block_study(tmp_path_factory, token_cache, recurrent_checkpoint):
    """A frozen study of the tiny checkpoint searching block maps only (2x: up to 8 layer runs), 10 trials on window
    chunk 0 with 2,1,1,1 (block 0-0 run twice, the layer the checkpoint learned to run twice) asked for first, raced
    on chunks 1 to 4: (its folder, storage URL, `run --json` summary)."""
    root = tmp_path_factory.mktemp("block-heatmap")
    space = write_space(root / "space.toml", search=BLOCKS, train={"eval_windows": 16})
    url = f"sqlite:///{root / 'blocks.db'}"
    with one_core():  # raced in this process (conftest.one_core)
        proc = run_cli(
            [
                *frozen_run_args(space, recurrent_checkpoint, "2x", url),
                "--enqueue",
                "2,1,1,1",
                "--study",
                "bh",
                "--json",
            ],
            root,
            {"ILR_SEARCH_CACHE": str(token_cache)},
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, url, json.loads(proc.stdout)


def blocks_view(cli, root, url, *extra):
    return cli("pareto", "--study", "bh", "--storage", url, "--view", "blocks", *extra, cwd=root)


def test_the_cells_are_the_stored_results(block_study, cli):
    """Each block a trial or the race scored is one cell: the race's comparison where it raced the block (its mean
    difference, interval, status, chunks and windows), else its trial's loss on window chunk 0 minus the plain
    model's there, as the trials store them."""
    root, url, summary = block_study
    race = summary["race"]
    proc = blocks_view(cli, root, url, "--json")
    assert proc.returncode == 0, proc.stderr
    grid = json.loads(proc.stdout)["blocks"]
    trials = optuna.load_study(study_name="bh", storage=url).trials
    chunk0 = {t.user_attrs["map_key"]: t.user_attrs["val_loss"] for t in trials if "reused_from" not in t.user_attrs}
    compared = {c["map"]: c for c in race["comparisons"]}
    cells = {c["map"]: c for c in grid["cells"]}
    expected = {k for k in chunk0 if k != PLAIN and block_place(k, 4) is not None} | {
        k for k in compared if block_place(k, 4) is not None
    }
    assert set(cells) == expected and len(cells) >= 4
    assert grid["plain"] == PLAIN and grid["plain_loss"] == chunk0[PLAIN] and grid["screen_chunk"] == 0
    for key, cell in cells.items():
        place = block_place(key, 4)
        assert (cell["start"], cell["end"], cell["repeats"]) == (place.start, place.end, place.repeats)
        assert cell["start"] <= cell["end"] and cell["repeats"] >= 2
        c = compared.get(key)
        if c is not None:
            assert cell["source"] == RACED and cell["diff"] == c["mean_diff"] and cell["interval"] == c["interval"]
            assert cell["status"] == c["status"] and cell["chunks"] == c["seeds"] and cell["units"] == c["units"]
            assert 0 not in cell["chunks"] and cell["units"] == 16 * len(cell["chunks"])  # 16 windows a chunk
        else:
            assert cell["source"] == SCREEN and cell["chunks"] == [0] and cell["interval"] is None
            assert cell["status"] == NOT_RACED
            assert cell["diff"] == pytest.approx(chunk0[key] - chunk0[PLAIN], abs=1e-12)
    by_source = {c["source"] for c in cells.values()}
    assert by_source == {RACED, SCREEN}, by_source  # both kinds of cell are drawn
    assert cells["2,1,1,1"]["status"] == "better" and cells["2,1,1,1"]["diff"] < 0  # the block the model learned
    assert "block:1-2:2" in cells or any(k.startswith("block:") for k in cells)  # blocks longer than a layer too


def _block_traces(fig):
    """The figure's heatmaps (one a block panel) and the decision markers drawn on their axes."""
    heatmaps = [t for t in fig.data if isinstance(t, go.Heatmap)]
    axes = {h.xaxis for h in heatmaps}
    return heatmaps, [t for t in fig.data if isinstance(t, go.Scatter) and t.xaxis in axes]


def test_the_figure_draws_the_grid_first_with_the_decisions_marked(block_study, cli):
    from ilr_search.commands.report import front_figure

    root, url, _ = block_study
    grid = json.loads(blocks_view(cli, root, url, "--json").stdout)["blocks"]
    fig = front_figure("bh", url)
    heatmaps, marks = _block_traces(fig)
    repeats = sorted({c["repeats"] for c in grid["cells"]})
    assert len(heatmaps) == len(repeats) >= 2  # one panel per repeat count
    assert isinstance(fig.data[0], go.Heatmap)  # the first panel
    titles = [a.text for a in fig.layout.annotations]
    assert all(any(f"(R = {r})" in t for t in titles[: len(repeats)]) for r in repeats), titles
    limit = fig.layout.coloraxis.cmax
    assert fig.layout.coloraxis.cmin == -limit and limit == pytest.approx(grid["colour_limit"])
    for heatmap, r in zip(heatmaps, repeats, strict=True):
        drawn = {(i, j): z for i, row in enumerate(heatmap.z) for j, z in enumerate(row) if z is not None}
        cells = {(c["start"], c["end"]): c for c in grid["cells"] if c["repeats"] == r}
        assert set(drawn) == set(cells)  # no cell for the plain model, none below the diagonal
        for place, cell in cells.items():
            assert drawn[place] == cell["diff"]  # the true value; the colour axis clips it
            hover = heatmap.hovertext[place[0]][place[1]]
            assert cell["map"] in hover and cell["status"] in hover and "FLOP ratio" in hover
            assert f"{cell['diff']:+.4g} nats" in hover and "ppl " in hover
            if cell["source"] == RACED:
                assert "90% interval" in hover and f"{len(cell['chunks'])} test window chunk" in hover
            else:
                assert "window chunk 0 only" in hover
    decisions = {"claimed": {"better"}, "against": {"cannot win", "dominated", "worse", "diverged"}}
    marked = {}
    for t in marks:
        for x, y, h in zip(t.x, t.y, t.hovertext, strict=True):
            marked[re.match(r"<b>([^<]+)</b>", h).group(1)] = t.legendgroup
            assert abs(x - round(x) - 0.3) < 1e-9 and abs(y - round(y) + 0.3) < 1e-9  # in the cell's corner
    for cell in grid["cells"]:
        want = next(
            (d for d, statuses in decisions.items() if cell["status"] in statuses),
            "undecided" if cell["source"] == RACED else None,
        )
        assert marked.get(cell["map"]) == want, (cell, marked)
    assert "claimed" in marked.values()
    names = {t.name for t in fig.data if t.name}
    assert any(n.startswith("claimed better") for n in names)


def test_a_frozen_block_studys_figure_leaves_out_what_means_nothing_frozen(block_study):
    from ilr_search.commands.report import front_figure

    _, url, _ = block_study
    fig = front_figure("bh", url)
    text = " ".join(a.text or "" for a in fig.layout.annotations)
    for absent in (
        "validation loss against step",
        "reuse counts",
        "layer importance",
        "rung agreement",
        "fidelity",
        "0 steps",
        "0x",
        "seed",
    ):
        assert absent not in text, absent
    assert "on held-out windows" in text and "window chunk 0" in text
    legends = " ".join(t.name for t in fig.data if t.name)
    for word in (r"seed", r"training", r"\b0x\b", r"proxy", r"\b0 steps"):  # test_frozen_words.py's
        assert not re.search(word, text + legends), word
    assert not any(isinstance(t, go.Bar) for t in fig.data)  # under 10 block trials: no block importances
    hovers = " ".join(h for t in fig.data if isinstance(t, go.Scatter) and t.hovertext for h in t.hovertext)
    assert "map block:" in hovers  # a block's trial names its block, not its counts


def test_the_terminal_grid_agrees_with_the_figure(block_study, cli):
    root, url, summary = block_study
    grid = json.loads(blocks_view(cli, root, url, "--json").stdout)["blocks"]
    proc = blocks_view(cli, root, url)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert text.splitlines()[0] == summary["answer"] and text.startswith("use ")  # the answer first
    tables = re.split(r"^R = (\d+): ", text, flags=re.M)[1:]
    assert sorted(int(r) for r in tables[::2]) == sorted({c["repeats"] for c in grid["cells"]})
    for r, table in zip(tables[::2], tables[1::2], strict=True):
        rows = [line for line in table.splitlines() if line.startswith("│")]
        header = next(line for line in table.splitlines() if "I \\ J" in line)
        ends = [int(e) for e in re.findall(r"\d+", header)]
        printed = {}
        for line in rows:
            parts = [p.strip() for p in line.strip("│").split("│")]
            for end, value in zip(ends, parts[1:], strict=True):
                if value:
                    printed[(int(parts[0]), end)] = value
        cells = {(c["start"], c["end"]): c for c in grid["cells"] if c["repeats"] == int(r)}
        assert set(printed) == set(cells)
        for place, c in cells.items():
            mark = {"better": "*", "dominated": "x", "cannot win": "x", "worse": "x"}.get(c["status"], "")
            if c["source"] == RACED and not mark:
                mark = "~"
            assert printed[place] == f"{c['diff']:+.3g}{mark}", (place, printed[place], c)
    assert "below 0 better" in text and "* claimed better" in text and "x decided against" in text
    assert "~ raced, undecided" in text
    for word in (r"seed", r"training", r"\b0x\b", r"proxy", r"\b0 steps"):  # test_frozen_words.py's
        assert not re.search(word, text), word


def test_a_study_without_blocks_is_one_error_line(cli, tmp_path, recurrent_checkpoint):
    space = write_space(
        tmp_path / "ilr.toml",
        search={**BLOCKS, "families": ["ilr"], "n_trials": 2, "race_seeds": 1},
        train={"eval_windows": 8},
    )
    url = f"sqlite:///{tmp_path / 'ilr.db'}"
    proc = cli(
        *frozen_run_args(space, recurrent_checkpoint, "1.5x", url),
        "--study",
        "plain",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "front.html"
    for extra in ([], ["--json"], ["--out", str(out)]):
        proc = cli("pareto", "--study", "plain", "--storage", url, "--view", "blocks", *extra)
        assert_one_line_error(proc)
        assert "searches no block maps" in proc.stderr
    assert not out.exists()
    proc = cli("pareto", "--study", "plain", "--storage", url, "--view", "grid")
    assert_one_line_error(proc)


def test_knobs_make_panels_of_their_own_and_the_colour_is_clipped_at_a_catastrophe():
    settings = RaceSettings(0, 0, seeds=(0, 1, 2), race_contenders=6, frozen=True)

    def result(key, seed, loss, ratio=1.5):
        state = "complete" if loss is not None else "failed"
        return race_result(
            Run(
                "trial",
                key,
                "1",
                seed,
                state,
                ratio,
                0,
                val_loss=loss,
                val_ppl=math.exp(loss) if loss else None,
                trial=0,
            )
        )

    losses = {
        "block:0-1:2": 2.9,
        "block:0-1:2|damping=0.5": 2.95,
        "block:1-2:2": 3.02,
        "block:2-3:2": 12.0,
        "1,3,1,1": 3.1,
        "block:1-2:3": 3.05,
        "2,2,1,1": 2.8,
    }  # 2,2,1,1 is no single block
    results = [result(PLAIN, s, 3.0, 1.0) for s in (0, 1, 2)] + [result(k, 0, v) for k, v in losses.items()]
    results.append(result("block:0-2:2", 0, None))  # diverged
    comparison = Comparison(
        "block:0-1:2", 1.5, (1, 2), -0.08, 0.01, (-0.1, -0.06), 0.001, -8.0, 0.05, 2.0, "better", units=32
    )
    grid = block_grid(results, [comparison], 4, PLAIN, settings)
    assert [p.title for p in grid.panels()] == ["R = 2", "R = 3", "R = 2, damping=0.5"]
    cells = {c.map_key: c for c in grid.cells}
    assert set(cells) == set(losses) - {"2,2,1,1"} | {"block:0-2:2"}
    assert cells["block:0-1:2"].diff == -0.08 and cells["block:0-1:2"].mark == "*"  # the comparison, not chunk 0
    assert cells["block:0-1:2|damping=0.5"].diff == pytest.approx(-0.05)
    assert (cells["1,3,1,1"].start, cells["1,3,1,1"].end, cells["1,3,1,1"].repeats) == (1, 1, 3)
    assert cells["block:0-2:2"].diff is None and cells["block:0-2:2"].mark == MARKS["against"]
    limit = grid.colour_limit()
    assert cells["block:2-3:2"].diff == pytest.approx(9.0) and limit < 1.0  # the catastrophe saturates
    assert limit >= max(abs(c.diff) for c in grid.cells if c.diff is not None and abs(c.diff) < 0.2)
    assert grid.ppl_diff(-0.08) == pytest.approx(math.exp(3.0) * (math.exp(-0.08) - 1))
    assert block_place(PLAIN, 4) is None and block_place("block:1-2:2|damping=0.5", 4) == BlockPlace(
        1, 2, 2, "damping=0.5"
    )


def _trial(n, ppl, ratio=1.2):
    return PlottedTrial(n, "COMPLETE", (1, 1, 1, 1), None, ratio, ppl, None, ppl)


def test_the_perplexity_axis_is_logarithmic_where_it_spans_decades():
    assert not log_axis([9.4, 10.1, 93.0]) and log_axis([9.4, 10.1, 1.4e5]) and not log_axis([None, 5.0])
    wide = pareto_figure("s", [_trial(0, 10.05, 1.0), _trial(1, 11.0), _trial(2, 1.4e5, 1.4)], [], None)
    assert wide.layout.yaxis.type == "log" and "log scale" in wide.layout.yaxis.title.text
    low, high = wide.layout.yaxis.range
    assert low < math.log10(10.05) and math.log10(1.4e5) < high
    narrow = pareto_figure("s", [_trial(0, 10.05, 1.0), _trial(1, 11.0)], [], None)
    assert narrow.layout.yaxis.type != "log"


def synthetic_block_report(n_layers=30):
    """A frozen block study's results on a 30-layer model, as the figure reads them: every block of length 4 and up
    in steps of 2 run twice (layer-scan's scan), some run 3 times, on chunk 0; the 12 best raced on chunks 1-4; the
    plain model; a catastrophe or two."""
    plain = ",".join(["1"] * n_layers)
    settings = RaceSettings(0, 0, seeds=(0, 1, 2, 3, 4), race_contenders=6, frozen=True)
    keys = [f"block:{i}-{j}:2" for i in range(0, n_layers, 2) for j in range(i + 3, n_layers, 2)][:105]
    keys += [f"block:{i}-{i + 1}:3" for i in range(0, n_layers - 1, 3)]
    results, trials = [], []
    for s in range(5):
        results.append(Run("race", plain, "0", s, "complete", 1.0, 0, val_loss=2.3, val_ppl=10.0))
    for n, key in enumerate(keys):
        i, j = (int(x) for x in key[6:].split(":")[0].split("-"))
        loss = 2.3 + 0.002 * (j - i) + (9.0 if j == n_layers - 1 and i > 20 else 0.0) - 0.01 * (i == 10)
        ratio = 1 + (j - i + 1) * (int(key[-1]) - 1) / n_layers
        results.append(Run("trial", key, "1", 0, "complete", ratio, 0, val_loss=loss, val_ppl=math.exp(loss), trial=n))
        trials.append(
            PlottedTrial(n, "COMPLETE", (1,) * n_layers, None, ratio, math.exp(loss), 3.3, math.exp(loss), map=key)
        )
    raced = sorted(keys, key=lambda k: next(r.val_loss for r in results if r.map_key == k))[:12]
    comparisons, front = (
        [],
        [
            FrontRow(
                None,
                (1,) * n_layers,
                plain,
                None,
                1.0,
                10.0,
                None,
                None,
                0,
                (0, 1, 2, 3, 4),
                (9.6, 10.4),
                is_baseline=True,
            )
        ],
    )
    for k, key in enumerate(raced):
        ratio = next(r.flops_ratio for r in results if r.map_key == key)
        for s in range(1, 5):
            results.append(Run("race", key, "0", s, "complete", ratio, 0, val_loss=2.29, val_ppl=9.9))
        status = ("better", "cannot win", "open", "dominated")[k % 4]
        comparisons.append(
            Comparison(key, ratio, (1, 2, 3, 4), -0.01, 0.01, (-0.02, 0.0), 0.04, -2.0, 0.05, 2.0, status, units=128)
        )
        if status == "better":
            front.append(
                FrontRow(None, None, key, None, ratio, 9.9, None, None, 0, (0, 1, 2, 3, 4), (9.7, 10.1), confirmed=True)
            )
    state = RaceState(alive=(), comparisons=tuple(comparisons), verdict="recurrence beats the baseline", done=True)
    race = RaceReport(
        settings, tuple(results), state, tuple(front), None, None, Answer("use block:10-13:2"), "constant"
    )
    return trials, race, block_grid(results, comparisons, n_layers, plain, settings)


def test_a_30_layer_block_studys_page_is_offline_and_small():
    trials, race, grid = synthetic_block_report()
    assert len(grid.cells) > 100 and {p.repeats for p in grid.panels()} == {2, 3}
    fig = pareto_figure("smol", trials, [], None, race=race, answer=race.answer, blocks=grid)
    page = figure_page(fig)
    size = len(page.encode("utf-8"))
    print(f"30-layer block study page: {size} bytes, {len(grid.cells)} blocks")
    assert size <= MAX_PAGE_BYTES
    assert not re.search(r"<script[^>]+src=", page) and "https://cdn" not in page  # nothing fetched
    packed = re.search(r'id="plotly-js-gzip-base64">([^<]+)<', page).group(1)
    library = gzip.decompress(base64.b64decode(packed))
    assert (
        hashlib.sha256(library).hexdigest() == PLOTLY_BUNDLE_SHA256
        and f"v{PLOTLY_BUNDLE_VERSION}" in library[:200].decode()
    )
    figure = json.loads(re.search(r'id="figure-json">(.+?)</script>', page, re.S).group(1))
    assert figure["data"][0]["type"] == "heatmap" and figure["layout"]["coloraxis"]["cmax"] < 9.0  # clipped
    assert '"responsive": true' in page


def test_a_point_with_no_interval_has_no_error_bar_and_a_raced_one_has_its_interval():
    trials, race, grid = synthetic_block_report()
    fig = pareto_figure("smol", trials, [], None, race=race, answer=race.answer, blocks=grid)
    decided = [t for t in fig.data if isinstance(t, go.Scatter) and t.mode == "markers" and t.hovertext]
    screened = [t for t in decided if t.name.replace("<br>", " ").startswith("screened")]
    assert screened and all("no interval" in h for t in screened for h in t.hovertext)
    assert all(t.error_y.array is None for t in screened)  # no zero-length bar through the circle
    with_bars = [t for t in decided if t.error_y.array is not None]
    assert with_bars
    for t in with_bars:
        for hover, up, down in zip(t.hovertext, t.error_y.array, t.error_y.arrayminus, strict=True):
            assert (up is None) == (down is None) == ("no interval" in hover)
            if up is not None:
                assert up >= 0 and down >= 0


def test_the_vendored_plotly_bundle_is_the_one_plotly_draws_for():
    from plotly.offline import get_plotlyjs_version

    assert get_plotlyjs_version() == PLOTLY_BUNDLE_VERSION, "refresh ilr_search/analysis/plotlyjs for this plotly"
    assert hashlib.sha256(gzip.decompress(PLOTLY_BUNDLE.read_bytes())).hexdigest() == PLOTLY_BUNDLE_SHA256


CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium: apt-get install chromium")
def test_headless_chromium_draws_the_page_offline(block_study, tmp_path):
    """The page unzips its plotly.js and draws every panel with the network off: the DOM Chromium leaves has the
    plot's heatmap layers and the block panels' titles."""
    from ilr_search.commands.report import front_figure

    _, url, _ = block_study
    page = tmp_path / "blocks.html"
    page.write_text(figure_page(front_figure("bh", url)), encoding="utf-8")
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--virtual-time-budget=5000",
                "--dump-dom",
                Path(page).as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    dom = proc.stdout
    assert "js-plotly-plot" in dom and "heatmaplayer" in dom, proc.stderr[-2000:]
    drawn = dom.split('id="figure"')[1].split('id="figure-json"')[0]  # the figure's box, as the page left it
    assert re.search(r"<text[^>]*>blocks run twice \(R = 2\)", drawn) and "needs a browser with" not in drawn
