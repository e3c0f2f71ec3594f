"""The one compiled part: the Kineto slice decoder (``proflab.readers._kscan``).

It is optional: where no C compiler is at hand the install still succeeds and the reader
decodes with msgspec alone (the same tables, slower on large traces)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "proflab.readers._kscan",
            ["src/proflab/readers/_kscan.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
