"""Streamlit glue shared by app.py and the pages: sidebar, caches, downloads. No maths here."""
