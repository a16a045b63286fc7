"""The Pareto figure, readable: pruned trials off the perplexity axis (in a strip at their step), the axis fitted
to the complete trials, points at one FLOP ratio spread with hover for the map, labels that do not overlap, and
a width that follows the page."""

import dataclasses

from ilr_search.analysis.fidelity import NoiseBand
from ilr_search.analysis.plots import PlottedTrial, label_positions, pareto_figure, spread_range, spread_x
from ilr_search.analysis.results import FrontRow


def _row(trial, state, reuse_map, ratio, ppl, pruned_at=None):
    return PlottedTrial(
        trial, state, tuple(reuse_map), None, ratio, ppl if state == "COMPLETE" else None, None, ppl, pruned_at
    )


def _rows():
    same_ratio = [
        [2, 1, 1, 1, 2, 1, 1, 1],
        [1, 2, 1, 1, 1, 2, 1, 1],
        [1, 1, 2, 2, 1, 1, 1, 1],
        [3, 1, 1, 1, 1, 1, 1, 1],
        [1, 3, 1, 1, 1, 1, 1, 1],
        [1, 1, 3, 1, 1, 1, 1, 1],
        [1, 1, 1, 3, 1, 1, 1, 1],
        [1, 1, 1, 1, 3, 1, 1, 1],
    ]
    rows = [_row(0, "COMPLETE", [1] * 8, 1.0, 6.1)]
    rows += [_row(1 + i, "COMPLETE", m, 1.476, 5.8 + 0.05 * i) for i, m in enumerate(same_ratio)]
    rows += [
        _row(9, "PRUNED", [4, 1, 1, 1, 1, 1, 1, 1], 1.476, 14.9, 125),
        _row(10, "PRUNED", [1, 4, 1, 1, 1, 1, 1, 1], 1.476, 15.1, 125),
        _row(11, "FAIL", [1, 1, 4, 1, 1, 1, 1, 1], 1.3, None),
    ]
    return rows


def _trace(fig, name):
    return next(t for t in fig.data if t.name and t.name.startswith(name))


def test_pruned_trials_are_apart_and_the_axis_fits_the_complete_ones():
    rows = _rows()
    fig = pareto_figure("s", rows, [], NoiseBand((6.05, 6.1, 6.15)))
    low, high = fig.layout.yaxis.range
    complete = [r.plot_ppl for r in rows if r.state == "COMPLETE"]
    assert low <= min(complete) and max(complete) <= high < 14.9
    pruned = _trace(fig, "pruned")
    assert pruned.yaxis != "y" and set(pruned.y) == {"pruned at step 125"}
    assert _trace(fig, "failed").y == ("failed",)
    assert all("pruned at step 125" in h for h in pruned.hovertext)
    assert not any(a.text and "spread" in a.text for a in fig.layout.annotations)  # the band is in the legend


def test_points_at_one_flop_ratio_are_spread_with_the_map_in_the_hover():
    fig = pareto_figure("s", _rows(), [], None)
    complete = _trace(fig, "complete")
    at_ratio = [x for x, h in zip(complete.x, complete.hovertext, strict=True) if "FLOP ratio 1.476" in h]
    assert len(at_ratio) == 8 == len(set(at_ratio))
    assert all(abs(x - 1.476) < 0.05 for x in at_ratio)
    assert any("map 3,1,1,1,1,1,1,1" in h for h in complete.hovertext)
    pruned = _trace(fig, "pruned")
    assert len(set(pruned.x)) == 2  # the two pruned at the same ratio and step


def test_a_large_group_at_one_ratio_keeps_nearer_its_ratio_than_any_other():
    """30 blocks of one layer at 1.027x beside 29 of two at 1.053x (a block scan): spread side by side, but none drawn
    at a FLOP ratio nearer another group's, and none below the plain model's 1.0x."""
    points = [(1.0, 10.0)] + [(1.027, 10.0 + k) for k in range(30)] + [(1.053, 10.0 + k) for k in range(29)]
    xs = [x for x, _ in points]
    axis = spread_range(xs)
    spread = spread_x(points, axis[1] - axis[0])
    for (x, _), drawn in zip(points, spread, strict=True):
        nearest = min({1.0, 1.027, 1.053}, key=lambda r: abs(r - drawn))
        assert nearest == x, (x, drawn)
    assert min(spread) == 1.0 and len(set(spread)) == len(spread)
    assert axis[0] < 1.0 < 1.053 < axis[1]


def test_the_figure_takes_its_page_width():
    fig = pareto_figure("s", _rows(), [], None)
    assert fig.layout.width is None and fig.layout.autosize


def test_labels_of_close_points_take_places_that_do_not_overlap():
    points = [(55.8, 17.29), (55.9, 17.32), (56.5, 17.30), (56.7, 17.32), (56.5, 17.22)]
    labels = ["2,1,1,1", "2,2,1,1", "3,2,1,1", "2,2,2,2", "2,3,1,1"]
    places = label_positions(points, labels, [55.0, 58.0], [17.1, 17.7])
    assert len(set(places[:2])) == 2 and len(set(places[2:4])) == 2  # close neighbours are labelled apart
    assert all(
        p
        in (
            "top center",
            "bottom center",
            "middle right",
            "middle left",
            "top right",
            "bottom left",
            "top left",
            "bottom right",
        )
        for p in places
    )


def test_a_curves_panel_draws_each_trained_trials_curve_with_the_front_in_colour():
    rows = [  # curves that cross: the first trial starts ahead and ends behind
        dataclasses.replace(
            r, curve=((10, 3.0 + 0.01 * r.trial), (20, 2.5 - 0.01 * r.trial)) if r.state != "FAIL" else ()
        )
        for r in _rows()
    ]
    front = [FrontRow(0, (1,) * 8, "1,1,1,1,1,1,1,1", None, 1.0, 6.1, None, None)]
    fig = pareto_figure("s", rows, front, None)

    def curve_lines(figure):
        return [t for t in figure.data if t.hovertext and ": loss " in str(t.hovertext[0])]

    lines = curve_lines(fig)
    assert len(lines) == sum(1 for r in rows if r.curve)
    coloured = [t for t in lines if t.line.width == 3]
    assert len(coloured) == 1 and "map 1,1,1,1,1,1,1,1" in coloured[0].hovertext[0]
    assert any("validation loss against step" in (a.text or "") for a in fig.layout.annotations)
    without = pareto_figure("s", _rows(), front, None)  # no curves stored: no panel
    assert curve_lines(without) == []
