"""Runs over image sets: the per-image pipeline, ``analyze``, ``stats``, ``faithfulness`` and ``registers`` runs and
their resumable stores, on one engine (:mod:`.engines`: a per-batch function over image files, here or on Ray
actors, and the Parquet parts that make a run resumable)."""
