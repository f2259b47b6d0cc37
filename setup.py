"""The compiled part of scopecast; everything else is declared in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("scopecast.netio._seq_table", ["scopecast/netio/_seq_table.c"],
                             extra_compile_args=["-O2", "-Wall", "-Wextra",
                                                 "-Wno-unused-parameter",
                                                 "-Wno-missing-field-initializers",
                                                 "-Wno-cast-function-type"])])
