"""Server-rendered SVG charts: where the points land, and what is drawn with too few."""

from __future__ import annotations

import re

from api.charts import Series, line_chart, sparkline


def points_of(svg: str) -> list[tuple[float, float]]:
    match = re.search(r'points="([^"]+)"', svg)
    assert match is not None
    return [(float(x), float(y)) for x, y in (p.split(",") for p in match.group(1).split())]


def test_a_sparkline_spans_its_box_with_higher_values_higher() -> None:
    drawn = points_of(str(sparkline([3.0, 1.0, 2.0], width=100, height=20)))
    assert [x for x, _ in drawn] == [2.0, 50.0, 98.0]
    assert drawn[0][1] == 2.0 and drawn[1][1] == 18.0  # the maximum on top (y grows down)


def test_a_flat_series_is_drawn_in_the_middle_and_one_point_is_no_line() -> None:
    assert {y for _, y in points_of(str(sparkline([5.0, 5.0])))} == {14.0}
    assert str(sparkline([1.0])) == ""
    assert "not enough points" in str(line_chart(Series([(1.0, 2.0)]), title="loss"))


def test_a_chart_labels_its_range_and_escapes_its_title() -> None:
    svg = str(line_chart(Series([(1, 4.0), (5, 2.0), (9, 1.0)], breaks=[5]), title="<loss>"))
    assert "&lt;loss&gt; (latest 1)" in svg and "<loss>" not in svg
    assert ">4<" in svg and ">1<" in svg and ">9<" in svg  # y max, y min, last step
    assert svg.count('class="break"') == 1
    assert len(points_of(svg)) == 3


def test_large_values_get_short_labels() -> None:
    svg = str(line_chart(Series([(1, 1234.0), (2, 34_619.0), (3, 2_500_000.0)]), title="tok/s"))
    assert ">1.23k<" in svg and ">2.5M<" in svg and "(latest 2.5M)" in svg
