"""The compiled parts: the Kineto slice decoder (``proflab.readers._kscan``) and the SQLite
column reader of Nsight Systems exports (``proflab.readers._sqlscan``).

Both are optional: where no C compiler is at hand the install still succeeds, the Kineto
reader decodes with msgspec alone and the export reader reads through the ADBC driver (the
same tables, slower on large inputs)."""

import sys

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "proflab.readers._kscan",
            ["src/proflab/readers/_kscan.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "proflab.readers._sqlscan",
            ["src/proflab/readers/_sqlscan.c"],
            extra_compile_args=["-O2"],
            libraries=["dl"] if sys.platform.startswith("linux") else [],
            optional=True,
        ),
    ]
)
