"""Builds the compiled modules from src_c/: fastq._core._ring (the ring, and the
consumer's batch views over its slots), fastq._layout._rows (the producer's copies
into slots), fastq._core._mapping (a shared mapping at an address aligned to a
huge page), fastq._make._seeding (the per-batch seeds of a worker's global
generators) and fastq._workers._records (the read path of shared records)."""

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra"]

ring = Extension(
    "fastq._core._ring",
    sources=["src_c/_ring.pyx", "src_c/fq_ring.c", "src_c/fq_flags.c"],
    include_dirs=["src_c", numpy.get_include()],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    depends=[
        "src_c/fq_ring.h",
        "src_c/fq_layout.h",
        "src_c/fq_wait.h",
        "src_c/fq_ring.pxd",
        "src_c/_consumer.pxi",
        "src_c/_views.pxi",
    ],
    extra_compile_args=CFLAGS,
)

rows = Extension(
    "fastq._layout._rows",
    sources=["src_c/_rows.pyx"],
    include_dirs=["src_c", numpy.get_include()],
    depends=["src_c/fq_stream.h"],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    extra_compile_args=CFLAGS,
)

mapping = Extension(
    "fastq._core._mapping",
    sources=["src_c/_mapping.pyx"],
    extra_compile_args=CFLAGS,
)

seeding = Extension(
    "fastq._make._seeding",
    sources=["src_c/_seeding.pyx"],
    extra_compile_args=CFLAGS,
)

records = Extension(
    "fastq._workers._records",
    sources=["src_c/_records.pyx"],
    extra_compile_args=CFLAGS,
)

setup(
    ext_modules=cythonize(
        [ring, rows, mapping, seeding, records],
        include_path=["src_c"],
        compiler_directives={"language_level": "3", "embedsignature": True},
    ),
)
