"""The room for files: one atomic writer (:mod:`vitviz.io.atomic`), and the locks and parts that build on it."""
