"""The engine and the loop's side: the engine both faces hold (``_engine``), the
feed that waits and hands out in order (``_consumer``), where the loop is
(``_cursor``), what went wrong in words (``_diagnosis``), ``workers="auto"``'s
tuner (``_autotune``) and a DataLoader's plan ahead of its workers
(``_planner``).

May import: ``fastq._workers`` and every layer below it.
"""
