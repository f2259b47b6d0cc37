"""Spark on the session's Ray through RayDP: the Java check, the configs it starts with, and a
DataFrame (from pandas, through a Python UDF) that reaches Ray Data row for row."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import ray

import scopecast
from scopecast.ray_cluster import spark as spark_mod
from scopecast.ray_cluster.spark import (
    FETCH_CPU_KEY,
    JAVA_OPTION_KEYS,
    JAVA_OPTIONS,
    LOG4J_KEY,
    check_cpus,
    check_java,
    init_spark,
    parse_java_version,
    spark_configs,
    stop_spark,
)

# ---------------------------------------------------------------------- unit: no Spark started


@pytest.mark.parametrize("output, major", [
    ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment (build 17.0.15+6-Debian-1deb12u1)\n'
     'OpenJDK 64-Bit Server VM (build 17.0.15+6-Debian-1deb12u1, mixed mode, sharing)\n', 17),
    ('java version "1.8.0_392"\nJava(TM) SE Runtime Environment (build 1.8.0_392-b08)\n', 8),
    ('openjdk version "1.8.0_402-ea"\n', 8),
    ('openjdk version "11.0.22" 2024-01-16\n', 11),
    ('openjdk version "21" 2023-09-19\nOpenJDK Runtime Environment (build 21+35-2513)\n', 21),
    ('openjdk version "22-ea" 2024-03-19\n', 22),
    ('java version "9.0.4"\n', 9),
    ('Picked up JAVA_TOOL_OPTIONS: -Dfile.encoding=UTF-8\nopenjdk version "17.0.2" 2022-01-18\n', 17),
    ('', None),
    ('bash: java: command not found\n', None),
    ('openjdk version "abc"\n', None),
])
def test_parse_java_version(output, major):
    assert parse_java_version(output) == major


def test_missing_java_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(scopecast.SparkUnavailable) as err:
        check_java()
    assert str(err.value) == ("Java 17 or newer is needed for Spark; install it, e.g. apt-get install "
                              "openjdk-17-jre-headless")
    assert isinstance(err.value, scopecast.ScopecastError)


def _fake_java(folder, version_line: str) -> str:
    """A `java` that prints `version_line` to stderr as `java -version` does."""
    folder.mkdir(parents=True, exist_ok=True)
    java = folder / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return str(java)


def test_old_java_is_named(tmp_path, monkeypatch):
    java = _fake_java(tmp_path / "bin", 'java version "1.8.0_392"')
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(scopecast.SparkUnavailable) as err:
        check_java()
    assert "found Java 8 at " + java in str(err.value)
    assert "openjdk-17-jre-headless" in str(err.value)


def test_java_home_is_checked_too(tmp_path, monkeypatch):
    """spark-submit runs $JAVA_HOME/bin/java for the driver even when PATH has a good one."""
    home = tmp_path / "jdk11"
    java = _fake_java(home / "bin", 'openjdk version "11.0.22" 2024-01-16')
    monkeypatch.setenv("JAVA_HOME", str(home))
    with pytest.raises(scopecast.SparkUnavailable, match="found Java 11 at " + java):
        check_java()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # JAVA_HOME alone is enough when it is new
    _fake_java(home / "bin", 'openjdk version "21" 2023-09-19')
    assert check_java() == 21


def test_real_java_is_17_or_newer():
    assert check_java() >= 17


def test_configs_open_java_modules_and_keep_user_options():
    user = {"spark.executor.extraJavaOptions": "-Dfoo=bar", "spark.sql.shuffle.partitions": 4}
    merged = spark_configs(user)
    opened = " ".join(JAVA_OPTIONS)
    assert merged["spark.executor.extraJavaOptions"] == "-Dfoo=bar " + opened
    assert merged["spark.driver.extraJavaOptions"] == opened
    assert merged["spark.ray.raydp_app_master.extraJavaOptions"] == opened
    assert merged["spark.sql.shuffle.partitions"] == "4"
    assert merged["spark.pyspark.python"] == sys.executable
    assert user["spark.executor.extraJavaOptions"] == "-Dfoo=bar"  # the caller's dict is left alone
    assert len(JAVA_OPTIONS) == 17
    assert "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED" in JAVA_OPTIONS
    assert spark_configs({"spark.pyspark.python": "/opt/py"})["spark.pyspark.python"] == "/opt/py"
    assert merged[FETCH_CPU_KEY] == "1"  # from_spark's fetch tasks: as many at once as free CPUs
    assert spark_configs({FETCH_CPU_KEY: 0})[FETCH_CPU_KEY] == "0"


def test_the_driver_gets_a_log4j_file_that_exists_unless_the_user_names_one():
    """RayDP's default names a file that does not exist (log4j then prints an error at start)."""
    ours = Path(spark_configs()[LOG4J_KEY])
    assert ours.is_file() and "rootLogger.level = warn" in ours.read_text()
    assert spark_configs({LOG4J_KEY: "/etc/mine.properties"})[LOG4J_KEY] == "/etc/mine.properties"


def test_the_driver_jvms_core_info_lines_go_to_the_log_and_its_other_lines_print(capfd, caplog):
    """Spark's driver JVM, started in `_driver_jvm_stderr`, writes to a pipe that a thread relays
    to this process's stderr, less the Ray core's INFO lines, which are logged; what it prints
    after the block (the JVM outlives it) is relayed too. A real child process stands in for it."""
    core = ("[2026-12-06 17:42:26,807 I 8079 8126] gcs_client.cc:96: GcsClient has no Cluster ID "
            "set, and won't fetch from GCS.")
    script = (f"import sys, time; sys.stderr.write({core!r} + '\\n'); sys.stderr.flush(); "
              "time.sleep(0.3); sys.stderr.write('WARN SparkContext: spark says this\\n')")
    caplog.set_level("INFO", logger=spark_mod.log.name)
    before = set(threading.enumerate())  # (a real driver JVM's relay may run already)
    with spark_mod._driver_jvm_stderr():
        child = subprocess.Popen([sys.executable, "-c", script])
        print("this process's own line", file=sys.stderr)
    relay = [t for t in set(threading.enumerate()) - before if t.name == "scopecast-spark-stderr"]
    assert child.wait(timeout=30) == 0
    for thread in relay:
        thread.join(timeout=30)  # (ends at the pipe's EOF: the child gone)
    err = capfd.readouterr().err
    assert "spark says this" in err and "this process's own line" in err
    assert "GcsClient" not in err
    assert any("GcsClient has no Cluster ID" in r.getMessage() for r in caplog.records)


def test_init_spark_needs_connect(monkeypatch):
    monkeypatch.setattr(spark_mod.ray, "is_initialized", lambda: False)
    with pytest.raises(scopecast.NotConnected, match=r"scopecast\.connect\(\) first"):
        init_spark()


def test_stop_spark_without_spark_is_a_no_op(monkeypatch):
    import raydp.context

    monkeypatch.setattr(raydp.context, "_global_spark_context", None)
    stop_spark()
    stop_spark()


# ------------------------------------------------------------------------ with Ray and Spark


@pytest.mark.ray
def test_executors_that_do_not_fit_are_refused(cluster):
    free = ray.available_resources().get("CPU", 0.0)
    with pytest.raises(scopecast.SparkUnavailable, match="lower num_executors or executor_cores"):
        check_cpus(int(free) + 1, 1)
    with pytest.raises(scopecast.SparkUnavailable, match="at least 1"):
        check_cpus(0, 1)


@pytest.mark.ray
def test_spark_runs_with_opened_modules_and_the_venv_python(spark):
    conf = spark.sparkContext.getConf()
    for key in JAVA_OPTION_KEYS:
        assert all(opt in conf.get(key) for opt in JAVA_OPTIONS), key
    assert conf.get("spark.pyspark.python") == sys.executable
    assert os.environ["PYSPARK_PYTHON"] == sys.executable


@pytest.mark.ray
def test_second_init_is_refused_while_running(spark):
    with pytest.raises(scopecast.SparkUnavailable, match="stop_spark"):
        init_spark()


@pytest.mark.ray
def test_dataframe_from_pandas_through_udf_reaches_ray_data(spark):
    import pandas as pd
    from pyspark.sql.functions import udf

    n = 1000
    pdf = pd.DataFrame({"id": range(n), "price": [i * 0.25 for i in range(n)],
                        "name": [f"item-{i}" for i in range(n)]})
    df = spark.createDataFrame(pdf).repartition(3)  # pandas -> Arrow -> the executors' Python
    shout = udf(lambda s: s.upper(), "string")
    python = udf(lambda _: sys.executable, "string")
    df = df.withColumn("loud", shout("name")).withColumn("python", python("name"))

    rows = sorted(ray.data.from_spark(df).take_all(), key=lambda r: r["id"])

    assert [r["id"] for r in rows] == list(range(n))
    assert all(r["price"] == r["id"] * 0.25 for r in rows)
    assert all(r["name"] == f"item-{r['id']}" and r["loud"] == f"ITEM-{r['id']}" for r in rows)
    assert {r["python"] for r in rows} == {sys.executable}  # Spark's Python workers ran the venv's


@pytest.mark.ray
def test_spark_range_reaches_ray_data_exactly(spark):
    df = spark.range(0, 20_000, numPartitions=4).selectExpr("id", "id * id as square")
    ds = ray.data.from_spark(df)
    assert ds.count() == 20_000
    rows = ds.take_all()
    assert sorted(r["id"] for r in rows) == list(range(20_000))
    assert all(r["square"] == r["id"] ** 2 for r in rows)
