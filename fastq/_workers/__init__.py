"""The workers: the pool and its bounded teardown (``_pool``), the start method
and its context (``_start_method``), a worker's entry point, set-up and loops
(``_worker``, ``_worker_setup``, ``_worker_loops``), thread workers
(``_thread_workers``), the hand-shake before the ring exists (``_handshake``),
how the user's objects reach a worker (``_handoff``, ``_shared_arrays``,
``_shared_records``, ``_object_path``), what a dataset moves into shared
memory as workers start (``_before_workers``), the look for large
containers a worker would copy (``_copied_objects``), native thread pools
(``_threads``)
and the death watch (``_death_watch``).

May import: ``fastq._make``, ``fastq._layout``, ``fastq._core`` and
``fastq.errors``; never the loop's side or the faces.
"""
