"""The room for files: one atomic writer (:mod:`vitviz.io.atomic`), one writer per output folder
(:mod:`vitviz.io.lock`), and the parts that build on them."""
