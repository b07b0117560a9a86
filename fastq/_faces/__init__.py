"""The faces: ``Prefetcher`` (``_prefetcher``), its arguments (``_arguments``)
and how its engine starts (``_launch``), and the DataLoader face's planned
loader (``_planned``) with its first batches before the ring exists
(``_prober``, ``_first_batch``). The two faces hold the same engine; neither
imports the other.

May import: ``fastq._loop`` and every layer below it.
"""
