"""Building the SparkSession the connector uses."""

from __future__ import annotations

import os
import sys

#: Driver JVM options that make a small local Spark start fast (tests, laptops).
FAST_DRIVER_JVM = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"


def get_session(master: str | None = "local[2]", app_name: str = "cayuga", *, shuffle_partitions: int | None = None,
                fast_jvm: bool = False, extra: dict[str, str] | None = None):
    """A SparkSession for the connector (``getOrCreate``: reuses a running one).

    ``master=None`` leaves the master to ``spark-submit``. Executors run the
    same Python as the driver unless ``PYSPARK_PYTHON`` says otherwise."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    b = SparkSession.builder.appName(app_name)
    if master:
        b = b.master(master)
    b = b.config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
    if shuffle_partitions:
        b = b.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    if fast_jvm:
        b = b.config("spark.driver.extraJavaOptions", FAST_DRIVER_JVM)
    for k, v in (extra or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
