"""The figure built around the decision (issue 29), on a real raced tiny study: the top panel holds the raced maps
at the race's length only (each point a map's mean over its seeds there, with the race's interval as its error
bar), on one y-axis, and the figure's title is the verdict; the proxy trials have their own panel; every
coloured trace has a legend entry or is in the group of one; every colour is one CSS colour; the layer heatmap,
`pareto --view layers` and `recipe`'s default map read the decided (race) front."""

import json
import math
import re

import pytest
from conftest import RACE_STEPS as STEPS

CSS_COLOUR = re.compile(r"^(#[0-9a-fA-F]{3}|#[0-9a-fA-F]{6}|rgba?\([\d.\s,]+\)|[a-z]+)$")


@pytest.fixture(scope="module")
def raced(raced_study):
    """The session's raced study (3 trials raced at --target 2x, the adaptive race, up to 4 seeds): its URL, its
    pareto report with the layers view, and its front figure."""
    from ilr_search.commands.report import front_figure, pareto_report

    url = raced_study.url
    return url, pareto_report(raced_study.study, url, view="layers").to_json(), front_figure(raced_study.study, url)


def _key(hover):
    """The map key a hover text names ("map 2,1,1,1 (trial 3)<br>...")."""
    return re.match(r"map ([^ <]+)", hover).group(1)


def _means_at(report, steps):
    """map key -> (mean ppl, seeds) over the race's results at `steps`."""
    losses = {}
    for r in report["race"]["results"]:
        if r["steps"] == steps and r["val_loss"] is not None:
            losses.setdefault(r["map_key"], {})[r["seed"]] = r["val_loss"]
    return {k: (math.exp(sum(v.values()) / len(v)), sorted(v)) for k, v in losses.items()}


@pytest.mark.slow
def test_the_top_panel_holds_only_the_raced_maps_at_the_target_on_one_axis_titled_with_the_verdict(raced):
    _, report, fig = raced
    steps = report["target_steps"]
    assert steps == 2 * STEPS and {p["steps"] for p in report["pareto"]} == {steps}  # the race reached its target
    means = _means_at(report, steps)
    top = [t for t in fig.data if t.type == "scatter" and t.xaxis == "x" and t.yaxis == "y" and "markers" in t.mode]
    assert top
    seen = set()
    for trace in top:
        for y, hover in zip(trace.y, trace.hovertext, strict=True):
            key = _key(hover)
            mean, seeds = means[key]  # a map with results at the target, drawn at its mean there, over those seeds
            assert y == pytest.approx(mean, rel=1e-9) and f"{steps} steps, seeds {','.join(map(str, seeds))}" in hover
            seen.add(key)
    proxy = {r["map_key"]: r["val_ppl"] for r in report["race"]["results"] if r["steps"] == STEPS}
    assert not any(y == pytest.approx(v, rel=1e-9) for t in top for y in t.y for v in proxy.values())
    for p in report["pareto"]:  # the decided front's points carry the race's intervals as error bars
        key = ",".join(map(str, p["reuse_map"])) + (f"|{p['knobs']}" if p["knobs"] else "")
        assert key in seen
        trace, i = next((t, i) for t in top for i, h in enumerate(t.hovertext) if _key(h) == key)
        low, high = p["interval"]
        assert trace.error_y.array[i] == pytest.approx(high - p["val_ppl"])
        assert trace.error_y.arrayminus[i] == pytest.approx(p["val_ppl"] - low)
    assert any(t.name.replace("<br>", " ").startswith("the plain model (the reference)") for t in top)
    layout = fig.layout.to_plotly_json()
    axes = [k for k in layout if k.startswith("yaxis")]
    assert len(axes) > 1 and not any(layout[k].get("overlaying") for k in axes)  # none laid over another
    assert all(t.yaxis == "y" for t in fig.data if t.xaxis == "x")
    assert fig.layout.yaxis.title.text == f"perplexity at {steps} steps"
    title = " ".join(re.sub(r"<[^>]+>", " ", fig.layout.title.text).split())
    assert " ".join(report["verdict"].split()) in title and title.startswith(f"{report['study']}:")
    # the proxy trials are in their own panel, at the proxy's length
    proxy_panel = [t for t in fig.data if t.name == "complete trials"]
    assert len(proxy_panel) == 1 and proxy_panel[0].yaxis != "y"
    assert set(proxy_panel[0].y) <= {r["val_ppl"] for r in report["race"]["results"] if r["steps"] == STEPS}


@pytest.mark.slow
def test_every_coloured_trace_has_a_legend_entry_and_every_colour_is_one_css_colour(raced):
    _, _, fig = raced
    for trace in fig.data:
        marker, line = getattr(trace, "marker", None), getattr(trace, "line", None)
        coloured = (marker is not None and marker.color is not None) or (line is not None and line.color is not None)
        if coloured:
            assert trace.showlegend is not False or trace.legendgroup, trace
            if trace.showlegend is False:  # its group has an entry
                assert any(t.legendgroup == trace.legendgroup and t.showlegend is not False for t in fig.data)
        error = getattr(trace, "error_y", None)
        if error is not None and error.array is not None:
            assert isinstance(error.color, str), trace.name  # else plotly.js takes the marker's colour array
    colours = []

    def walk(node, key=""):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, k)
        elif isinstance(node, (list, tuple)):
            for v in node:
                walk(v, key)
        elif key.endswith("color") and isinstance(node, str):
            colours.append(node)

    walk([t.to_plotly_json() for t in fig.data])
    assert colours and all(CSS_COLOUR.match(c) for c in colours), [c for c in colours if not CSS_COLOUR.match(c)]
    legends = {t.legend or "legend" for t in fig.data if t.showlegend is not False}
    assert len(legends) >= 3  # a legend for each panel, to its right, under the title
    for name in legends:
        assert fig.layout[name].x > 1 and fig.layout[name].y <= 1


@pytest.mark.slow
def test_the_heatmap_view_layers_and_the_recipe_read_the_decided_front(raced, cli):
    url, report, fig = raced
    decided = report["pareto"]
    heatmap = next(t for t in fig.data if t.type == "heatmap")
    assert [list(z) for z in heatmap.z] == [p["reuse_map"] for p in decided]
    assert all(
        f"ppl {p['val_ppl']:.5g}" in label for p, label in zip(decided, heatmap.y, strict=True)
    )  # the race's mean
    layers = json.loads(
        cli("pareto", "--study", "raced", "--storage", url, "--view", "layers", "--json", check=True).stdout
    )["layers"]
    assert layers["front_maps"] == decided  # at the race's length, with its seeds and intervals
    proc = cli("recipe", "--study", "raced", "--storage", url, "--json", check=True)
    best = min(decided, key=lambda p: (p["val_ppl"], p["flops_ratio"]))
    assert json.loads(proc.stdout)["reuse_map"] == best["reuse_map"]
    assert (
        f"on the race's front at {report['target_steps']} steps" in proc.stderr and "lowest perplexity" in proc.stderr
    )


@pytest.mark.slow
def test_the_answer_is_the_first_line_of_trials_and_pareto_and_the_figures_title_starts_with_it(raced, cli):
    url, report, fig = raced
    answer = report["answer"]
    assert answer.startswith(("use ", "no map beat")), answer  # the race is done: a decision
    for command in ("trials", "pareto"):
        text = cli(command, "--study", report["study"], "--storage", url, check=True).stdout
        assert text.splitlines()[0] == answer, (command, text[:500])
        assert "worse than the baseline" not in text  # a futility stop says `stopped: cannot win`
        shown = json.loads(cli(command, "--study", report["study"], "--storage", url, "--json", check=True).stdout)
        assert shown["answer"] == answer and shown["verdict"] == report["verdict"]
    studies = cli("studies", "--storage", url, check=True).stdout
    assert f"{report['study']}: {answer}" in studies.splitlines()
    assert json.loads(cli("studies", "--storage", url, "--json", check=True).stdout)["studies"][0]["answer"] == answer
    title = " ".join(re.sub(r"<[^>]+>", " ", fig.layout.title.text).split())
    assert title.startswith(f"{report['study']}: {' '.join(answer.split())}")
    layers = cli("pareto", "--study", report["study"], "--storage", url, "--view", "layers", check=True).stdout
    assert re.search(r"^the decided front recurs (no layer|layers? [\d, and]+)$", layers, re.M), layers
    assert all(re.fullmatch(r"\d\.\d\d", v) for v in re.findall(r"│ (?:layer|knob) [^│]*│\s*([\d.]+)", layers))


def test_the_figures_title_puts_the_trust_line_between_the_answer_and_the_verdict():
    from ilr_search.analysis.answer import Answer, Trust
    from ilr_search.analysis.plots import verdict_title

    trust = Trust(spearman=-0.19, maps=8, proxy_steps=500, target_steps=2000)
    answer = Answer(
        "no map beat the plain model at 2000 steps; a gap of 0.14 ppl or more would have been seen", trust=trust
    )
    lines = verdict_title("s", answer, "nothing here is distinguishable; the race trained 46000 steps").split("<br>")
    text = [re.sub(r"<[^>]+>", "", line) for line in lines]
    trust_at = next(
        i for i, line in enumerate(text) if line.startswith("trust: the 500-step search ranked maps unlike")
    )
    assert text[0].startswith("s: no map beat") and lines[trust_at].startswith("<i>")
    assert trust_at < text.index("nothing here is distinguishable;")
    assert "weak guide" in " ".join(text[trust_at : text.index("nothing here is distinguishable;")])
    assert "trust" not in verdict_title("s", Answer("no map beat the plain model"), "v")  # none measured: none shown
