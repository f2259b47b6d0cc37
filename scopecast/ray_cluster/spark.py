"""Spark on the current Ray cluster, through RayDP, for pipelines that feed topics from DataFrames.

RayDP runs Spark's app master and executors as Ray actors, so a Spark job shares the Ray cluster (and
its object store: `ray.data.from_spark`) with scopecast's scope managers and agents. This module
starts it in the way that works here: Java 17's module rules opened for Spark and Arrow, the venv's
Python for Spark's Python workers, and executors sized so that they leave room on the cluster.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import ray

from scopecast.actors.errors import NotConnected, SparkUnavailable
from scopecast.actors.ray_private import CORE_INFO_LINE
from scopecast.extras import require

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

MIN_JAVA = 17
INSTALL_HINT = "install it, e.g. apt-get install openjdk-17-jre-headless"

# Java 17 closes these packages to reflection; Spark (unsafe memory, serializers) and Arrow (direct
# buffers) need them open. Without them in the executors, `ray.data.from_spark` kills the executor
# (Arrow's buffers); RayDP passes the executors' options to the Java actors it creates, so Ray's job
# config needs none (checked with Ray 2.60 / RayDP 1.6.5 / Java 17).
_OPENED = ("java.lang", "java.lang.invoke", "java.lang.reflect", "java.io", "java.math", "java.net",
           "java.nio", "java.text", "java.time", "java.util", "java.util.concurrent",
           "java.util.concurrent.atomic", "java.util.regex", "sun.nio.ch", "sun.nio.cs",
           "sun.security.action", "sun.util.calendar")
JAVA_OPTIONS: list[str] = [f"--add-opens=java.base/{pkg}=ALL-UNNAMED" for pkg in _OPENED]

# Where those options go: RayDP's app master JVM, Spark's driver JVM (this process's py4j gateway), and
# the executors (Java actors the app master creates).
JAVA_OPTION_KEYS = ("spark.ray.raydp_app_master.extraJavaOptions", "spark.driver.extraJavaOptions",
                    "spark.executor.extraJavaOptions")

# Kept free besides the executors' CPUs: RayDP's app master is a Ray actor with the default resources
# (one CPU to be scheduled), and Ray Data's tasks on the blocks from `ray.data.from_spark`
# (map_batches, ...) need a CPU while the executors hold theirs.
RESERVED_CPUS = 1

# RayDP's `from_spark` fetches each partition of a DataFrame in a Ray task that asks for no CPU by
# default: all at once, each in a worker process of its own. A shuffle's 200 partitions (the
# demo's 224 routes) started 35 processes, a minute on 2 cores; one CPU each bounds them by the
# free CPUs (RESERVED_CPUS at least), and the processes are reused from task to task.
FETCH_CPU_KEY = "spark.ray.raydp_recoverable_fetch.task.resource.CPU"

# RayDP names the driver's log4j2 file with this key; its default names a file that does not
# exist, so log4j printed "Reconfiguration failed: No configuration found" and Spark its notice
# about the default level. Ours is Spark's defaults at WARN, without Hadoop's native-library warning.
LOG4J_KEY = "spark.log4j.config.file.name"
LOG4J_FILE = Path(__file__).with_name("spark-log4j2.properties")

_VERSION = re.compile(r'version\s+"([^"]+)"')


def parse_java_version(output: str) -> int | None:
    """The major version in `java -version` output (`openjdk version "17.0.15"` -> 17,
    `java version "1.8.0_392"` -> 8), or None when the output names none."""
    match = _VERSION.search(output)
    if match is None:
        return None
    parts = re.split(r"[._+-]", match.group(1))
    if parts[0] == "1" and len(parts) > 1:  # the "1.x" scheme of Java 8 and older
        parts = parts[1:]
    digits = re.match(r"\d+", parts[0])
    return int(digits.group()) if digits else None


def java_executables() -> list[str]:
    """The `java` binaries Spark will run: `$JAVA_HOME/bin/java` (spark-submit prefers it for the
    driver) and the one on PATH (RayDP's app master runs plain `java`)."""
    found = []
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            found.append(str(candidate))
    on_path = shutil.which("java")
    if on_path and all(os.path.realpath(on_path) != os.path.realpath(f) for f in found):
        found.append(on_path)
    return found


def check_java() -> int:
    """Fail with SparkUnavailable unless every Java that Spark would use is 17 or newer; returns the
    lowest major version found."""
    found = java_executables()
    if not found:
        raise SparkUnavailable(f"Java {MIN_JAVA} or newer is needed for Spark; {INSTALL_HINT}")
    versions = []
    for java in found:
        try:
            run = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            raise SparkUnavailable(f"Java {MIN_JAVA} or newer is needed for Spark, but {java} -version "
                                   f"failed ({exc}); {INSTALL_HINT}") from None
        version = parse_java_version(run.stderr + "\n" + run.stdout)
        if version is None or version < MIN_JAVA:
            shown = f"Java {version}" if version is not None else "a Java of unknown version"
            raise SparkUnavailable(f"Java {MIN_JAVA} or newer is needed for Spark, found {shown} at "
                                   f"{java}; {INSTALL_HINT} (or set JAVA_HOME / PATH to a newer one)")
        versions.append(version)
    return min(versions)


def spark_configs(configs: dict | None = None) -> dict[str, str]:
    """The Spark configs init_spark passes to RayDP: the user's, with JAVA_OPTIONS appended to each of
    JAVA_OPTION_KEYS (not replacing a user's value) and the venv's Python for Spark's Python workers
    (without it, `createDataFrame` from pandas and Python UDFs run another interpreter and fail), a
    CPU for each of `from_spark`'s fetch tasks (see FETCH_CPU_KEY), and the driver's log4j2 file
    (see LOG4J_KEY)."""
    merged = {k: str(v) for k, v in (configs or {}).items()}
    opened = " ".join(JAVA_OPTIONS)
    for key in JAVA_OPTION_KEYS:
        user = merged.get(key, "").strip()
        merged[key] = f"{user} {opened}" if user else opened
    merged.setdefault("spark.pyspark.python", sys.executable)
    merged.setdefault(FETCH_CPU_KEY, "1")
    merged.setdefault(LOG4J_KEY, str(LOG4J_FILE))
    return merged


def check_cpus(num_executors: int, executor_cores: int) -> None:
    """Fail with SparkUnavailable unless the executors (plus what RayDP and Ray Data need besides)
    fit in the Ray cluster's free CPUs: executors waiting for CPUs that never come hang Spark."""
    if num_executors < 1 or executor_cores < 1:
        raise SparkUnavailable(f"num_executors and executor_cores must be at least 1, got "
                               f"{num_executors} and {executor_cores}")
    free = ray.available_resources().get("CPU", 0.0)
    needed = num_executors * executor_cores + RESERVED_CPUS
    if needed > free:
        raise SparkUnavailable(
            f"Spark needs {needed:g} free Ray CPUs ({num_executors} executor(s) x {executor_cores} "
            f"core(s) + {RESERVED_CPUS} for RayDP's app master and Ray Data's tasks) but the Ray cluster "
            f"has {free:g}: lower num_executors or executor_cores, or start Ray with more CPUs "
            f"(`ray start --num-cpus N`; the embedded Ray has max(8, 4 x cores))")


def init_spark(app_name: str = "scopecast", *, num_executors: int = 1, executor_cores: int = 1,
               executor_memory: str | int = "1G", configs: dict | None = None) -> SparkSession:
    """Start Spark on the current Ray cluster (after `scopecast.connect()`) and return its
    `pyspark.sql.SparkSession`. DataFrames it makes go to Ray with `ray.data.from_spark(df)`.

    Raises NotConnected when this process is not attached to Ray, and SparkUnavailable when Java is
    missing or older than 17, when the executors do not fit in the cluster's free CPUs, or when Spark
    is already running here (call stop_spark() first)."""
    require("spark", "init_spark")
    if not ray.is_initialized():
        raise NotConnected("Spark runs on the scopecast cluster's Ray: call scopecast.connect() first")
    import raydp  # late: pyspark and RayDP take a second to import, and only Spark users need them
    import raydp.context

    if getattr(raydp.context, "_global_spark_context", None) is not None:
        raise SparkUnavailable("Spark is already running in this process; call "
                               "scopecast.ray_cluster.spark.stop_spark() before starting it again")
    java = check_java()
    check_cpus(num_executors, executor_cores)
    merged = spark_configs(configs)
    os.environ["PYSPARK_PYTHON"] = merged["spark.pyspark.python"]
    with _driver_jvm_stderr():
        session = raydp.init_spark(app_name, num_executors, executor_cores, executor_memory,
                                   configs=merged)
    log.info("started Spark %s app %r on Ray (Java %d): %d executor(s) x %d core(s), %s each, "
             "master %s", session.version, app_name, java, num_executors, executor_cores,
             executor_memory, session.sparkContext.master)
    return session


@contextlib.contextmanager
def _driver_jvm_stderr():
    """Spark's driver JVM, started inside this block, gets a pipe as its stderr, relayed to this
    process's stderr by a thread for as long as the JVM runs, less the INFO lines of the Ray core
    worker it runs ("GcsClient has no Cluster ID set", twice, printed before that core reads any
    log level), which go to the log. Everything else the JVM prints (Spark's warnings, errors)
    shows as before; so does what this process prints meanwhile. Java workers' lines, which Ray
    forwards, are routed by ray_private.route_console_notices."""
    try:
        sys.stderr.flush()
        console = os.dup(2)
        read_end, write_end = os.pipe()
    except OSError as exc:  # (no stderr, no descriptors left: the lines show, nothing fails)
        log.info("Spark's driver JVM keeps this process's stderr: %s", exc)
        yield
        return
    os.dup2(write_end, 2)
    os.close(write_end)
    threading.Thread(target=_relay_jvm_stderr, args=(read_end, console), daemon=True,
                     name="scopecast-spark-stderr").start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(console, 2)  # (the JVM holds the pipe's last write end: EOF when it exits)


def _relay_jvm_stderr(read_end: int, console: int) -> None:
    with os.fdopen(read_end, "rb") as pipe:
        for line in pipe:
            if CORE_INFO_LINE.match(line.decode(errors="replace")):
                log.info("Spark driver JVM: %s", line.decode(errors="replace").rstrip())
                continue
            try:
                os.write(console, line)
            except OSError:
                break
    os.close(console)


def stop_spark() -> None:
    """Stop the Spark that init_spark started (its executors and app master leave Ray, freeing their
    CPUs); does nothing when none is running."""
    import raydp
    import raydp.context

    if getattr(raydp.context, "_global_spark_context", None) is None:
        return
    try:
        raydp.stop_spark()
    except Exception as exc:  # e.g. Ray already shut down: its actors went with it
        log.warning("stopping Spark: %s", exc)
    else:
        log.info("stopped Spark")
