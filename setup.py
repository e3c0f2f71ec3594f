"""The compiled parts: the Kineto slice decoder (``proflab.readers._kscan``), the SQLite
column reader of Nsight Systems exports (``proflab.readers._sqlscan``) and the what-if
replay's walk (``proflab.analysis.whatif._replay``).

All are optional: where no C compiler is at hand the install still succeeds, the Kineto
reader decodes with msgspec alone, the export reader reads through the ADBC driver and the
replay walks in Python (the same results, slower on large inputs)."""

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
        Extension(
            "proflab.analysis.whatif._replay",
            ["src/proflab/analysis/whatif/_replay.c"],
            # no fused multiply-add: the walk's floats must be the Python walk's, bit for bit
            extra_compile_args=["-O2", "-ffp-contract=off"],
            optional=True,
        ),
    ]
)
