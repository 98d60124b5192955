"""Files: ``files`` (atomic writes, output-path checks, locks), ``formats`` (JSON, safetensors, format version,
checksums), ``text`` (user text and TSV files, also by byte offset) and ``arrow`` (Parquet/Arrow columns and tables)."""
