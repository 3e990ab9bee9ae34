"""Every figure builder: Plotly figures per view, pixel overlays and colour scales, report PNGs and the browser
explorer's payload. Figures draw what the analyses computed; nothing here is imported by an analysis."""
