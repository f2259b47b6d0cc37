"""The compiled parts of the data path (see scopecast/netio/native.py). Each is optional: where it
cannot be built (no compiler, no Python headers, no libssl-dev) the build goes on without it and
scopecast runs its pure-Python twin instead; `scopecast doctor` says which. Everything else is
declared in pyproject.toml."""

from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers",
         "-Wno-cast-function-type"]
HEADERS = ["scopecast/netio/_open_table.h"]

setup(ext_modules=[
    *(Extension(f"scopecast.netio.{name}", [f"scopecast/netio/{name}.c"], depends=HEADERS,
                extra_compile_args=FLAGS, optional=True) for name in ("_seq_table", "_tail_table")),
    # GMAC as the `cryptography` package computes it, from the system's OpenSSL (libssl-dev)
    Extension("scopecast.netio._datagram_batch", ["scopecast/netio/_datagram_batch.c"],
              extra_compile_args=FLAGS, libraries=["crypto"], optional=True),
])
