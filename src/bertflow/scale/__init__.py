"""Scale-out: ``launch`` (processes and their topology), ``store`` (sharded embedding stores on disk), ``encode``
(sharded and multi-device encoding) and ``fit`` (exact distributed fitting). See ``docs/distributed.md``."""
