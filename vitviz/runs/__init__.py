"""Runs over image sets: the per-image pipeline, ``analyze``, ``stats``, ``faithfulness`` and ``registers`` runs and
their resumable stores."""
