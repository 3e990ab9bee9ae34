"""vitviz: see what a Vision Transformer does with an image. The core package; no Streamlit here."""

__version__ = "0.1.0"
