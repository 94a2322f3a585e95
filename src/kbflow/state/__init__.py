"""A namespace's state beside its store: the manifest and model record (``manifest``), the one-writer lock
(``lock``), Parquet snapshots written atomically (``snapshots``), and pruning of old runs (``housekeeping``)."""
