"""The ring and its protocol: the compiled ring (``_ring``: slots, the FREE and
READY queues, the consumer's views) and the aligned mapping (``_mapping``),
the shared region that holds them (``_shm``), made of an anonymous shared
file whose memory is checked and reserved (``_memfd``), the plan table
written into it (``_plan``), the turns of an ordered stream (``_turns``) and
the error reports that travel in a slot (``_report``).

May import: ``fastq.errors`` only. Everything else in fastq stands on it.
"""
