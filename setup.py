"""Builds the one compiled module, fastq._ring, from src_c/."""

from Cython.Build import cythonize
from setuptools import Extension, setup

ring = Extension(
    "fastq._ring",
    sources=["src_c/_ring.pyx", "src_c/fq_ring.c"],
    include_dirs=["src_c"],
    depends=["src_c/fq_ring.h", "src_c/fq_ring.pxd"],
    extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra"],
)

setup(
    ext_modules=cythonize(
        [ring],
        include_path=["src_c"],
        compiler_directives={"language_level": "3", "embedsignature": True},
    ),
)
