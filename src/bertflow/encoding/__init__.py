"""Core encoding: text to pooled sentence vectors with a frozen transformer.

``encoder`` (the batched forward pass), ``pooling`` (which hidden states become a sentence vector) and
``tokenization`` (the fast tokenizing path). Nothing here knows about calibration, files or processes.
"""
