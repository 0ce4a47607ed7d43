"""sparkstate's benchmark suite: ``python -m benchmarks.run`` (see benchmarks/README.md).

Modules: ``data`` (workloads and their generated Parquet input), ``jvm`` (the Java reference
compiled at run time), ``contenders`` (what is measured), ``measure`` (progress and memory),
``runner`` (one contender, one query), ``report`` (table and JSON), ``run`` (the command).
"""
