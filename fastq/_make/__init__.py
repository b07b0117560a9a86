"""What a worker makes, and from what: the index streams of map-style sources
(``_sampler``) and their place (``_state``), stream sources (``_streams``),
the per-sample fill of a map-style task (``_map_fill``), the per-batch seeds
(``_seeding``, compiled) and what a worker knows about itself
(``_worker_info``).

May import: ``fastq._layout``, ``fastq._core`` and ``fastq.errors``.
"""
