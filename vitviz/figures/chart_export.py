"""Plotly charts as SVG and PDF for papers, exactly as the page draws them: Plotly's own static export.

kaleido 1.x hands the figure to the installed plotly package's own plotly.js inside a headless Chrome or Chromium
(Debian's ``chromium`` here) and returns the browser's SVG (text as ``<text>`` elements) or its print-to-PDF (text
as embedded TrueType, searchable). One code path for every chart, so the file is the chart on the screen; images
inside a chart (the map tiles of a panel) stay embedded rasters. No network: the plotly.js file is the installed
package's and MathJax (a CDN script) is switched off. Each export starts the browser: about 2.5-3.5 s a file on a
quiet 2-core machine (``benchmarks/chart_export.py``); the map panels' own SVG/PDF
(:mod:`vitviz.figures.vector_figures`) need no browser.
"""
from __future__ import annotations

from ..errors import OptionError, VitvizError

FORMATS = ("svg", "pdf")
# px (1 px = 1/96 in in the PDF): a chart without its own width is as wide as the page's main column at 1440 px,
# so its titles and legends break where they do on the screen.
DEFAULT_WIDTH, DEFAULT_HEIGHT = 1090, 520
TIMEOUT_S = 120


class ChartExportError(VitvizError):
    """A chart cannot be written as SVG or PDF here (no browser for Plotly's static export)."""


def browser_path() -> str | None:
    """The Chrome or Chromium kaleido would start (``BROWSER_PATH``, else the usual names on PATH), or None."""
    try:
        from choreographer.browsers.chromium import Chromium
    except ImportError:
        return None
    return Chromium.find_browser(skip_local=False)


def unavailable_reason() -> str | None:
    """None when charts can be exported; otherwise the sentence saying why not and what to install."""
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return "SVG and PDF of charts need the kaleido package (pip install 'kaleido>=1.0', in requirements.txt)."
    if browser_path() is None:
        return ("SVG and PDF of charts need Chrome or Chromium on the server (Plotly's export draws the chart in it); "
                "none was found on PATH. Install one (Debian: apt-get install chromium) or set BROWSER_PATH to its "
                "executable. The PNG (the chart's camera button) works without it.")
    return None


def _page():
    """kaleido's page with CSS page margins of 0: its print-to-PDF asks for 0.1 in margins inside a page the size of
    the chart, which shifted the chart by 0.1 in and cut off its bottom and right edge (an axis title); the page's
    own CSS wins (Chrome's preferCSSPageSize). MathJax (a CDN script) off: no network."""
    from kaleido import PageGenerator

    class Page(PageGenerator):
        header = PageGenerator.header.replace(
            '<style id="head-style"></style>', '<style>@page { margin: 0; }</style><style id="head-style"></style>'
        ).replace("<title>Kaleido-fier</title>", "<title>vitviz chart</title>")  # the PDF's Title

    assert Page.header != PageGenerator.header, "kaleido's page header changed: check the PDF margins"
    return Page(mathjax=False)


def chart_file(fig, fmt: str, *, width: int | None = None, height: int | None = None) -> bytes:
    """One Plotly figure as an SVG or PDF file with vector text.

    Args:
        fig: a ``plotly.graph_objects.Figure`` (not changed).
        fmt: ``"svg"`` or ``"pdf"``.
        width, height: the page size in CSS pixels (1/96 in); default the figure's own, else 900 x 520.

    Returns:
        The file's bytes.

    Raises:
        ChartExportError: no kaleido or no browser (:func:`unavailable_reason`'s sentence), or the browser failed.
    """
    if fmt not in FORMATS:
        raise OptionError(f"format must be one of {FORMATS}, not {fmt!r}")
    reason = unavailable_reason()
    if reason:
        raise ChartExportError(reason)
    import kaleido

    spec = fig.to_dict()
    layout = spec.get("layout", {})
    width = int(width or layout.get("width") or DEFAULT_WIDTH)
    height = int(height or layout.get("height") or DEFAULT_HEIGHT)
    try:
        data = kaleido.calc_fig_sync(spec, opts=dict(format=fmt, width=width, height=height, scale=1),
                                     kopts=dict(page_generator=_page(), timeout=TIMEOUT_S))
    except Exception as exc:  # the browser did not start or did not answer: a setup problem, said as one
        raise ChartExportError(f"Plotly's export could not draw the chart as {fmt.upper()} in the browser at "
                               f"{browser_path()} ({type(exc).__name__}: {exc}).") from exc
    return data if isinstance(data, bytes) else bytes(data)
