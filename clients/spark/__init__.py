"""The Spark connector: bulk event source and witness sink for a running server,
and distributed batch execution of subscriptions inside Spark executors.

Import the pieces from their modules (:mod:`clients.spark.run`,
:mod:`clients.spark.source`, :mod:`clients.spark.sink`; the planner is
:mod:`air.partitioning`, shared with the server); importing this package does
not import pyspark.
"""
