"""Files: ``files`` (atomic writes, output-path checks, locks), ``formats`` (JSON, safetensors,
format version, checksums) and ``text`` (reading user text and TSV files, also by byte offset)."""
