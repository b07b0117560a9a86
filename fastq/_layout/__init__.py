"""A batch's layout in a slot: its structure and fields (``_spec``), what a
spec is inferred from (``_spec_infer``), variable-length fields
(``_jagged``), packed slots of any structure (``_packing``), and the compiled
writer of samples into a slot's rows (``_rows``).

May import: ``fastq._core`` and ``fastq.errors``.
"""
