"""The compiled part of scopecast; everything else is declared in pyproject.toml."""

from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers",
         "-Wno-cast-function-type"]
HEADERS = ["scopecast/netio/_open_table.h"]

setup(ext_modules=[
    *(Extension(f"scopecast.netio.{name}", [f"scopecast/netio/{name}.c"], depends=HEADERS,
                extra_compile_args=FLAGS) for name in ("_seq_table", "_tail_table")),
    # GMAC as the `cryptography` package computes it, from the system's OpenSSL (libssl-dev)
    Extension("scopecast.netio._datagram_batch", ["scopecast/netio/_datagram_batch.c"],
              extra_compile_args=FLAGS, libraries=["crypto"]),
])
