"""The room for files: one atomic writer (:mod:`vitviz.io.atomic`), the output-folder lock (:mod:`vitviz.io.lock`),
and the parts that build on them."""
