"""Import everything the figures need once, before any page runs.

Plotly imports pandas lazily and checks ``sys.modules`` without waiting for an import in
progress: eight sessions arriving at a cold server got ``partially initialized module 'pandas'
has no attribute 'Series'``. ``app.py`` imports this module first; Python's import lock makes
every other session wait until it has finished.
"""
import numpy  # noqa: F401
import pandas  # noqa: F401
import plotly.express  # noqa: F401
import plotly.graph_objects as go
import plotly.io

import ui.cache  # noqa: F401
import ui.charts  # noqa: F401
import ui.display  # noqa: F401
import ui.downloads  # noqa: F401
import vitviz.figures.core  # noqa: F401

# One tiny figure through plotly's serialiser pulls in its remaining lazy imports (validators, json engine).
plotly.io.to_json(go.Figure([go.Heatmap(z=[[0.0, 1.0]]), go.Scatter(x=[0], y=[0])]))
