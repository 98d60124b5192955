"""Core encoding: text to pooled sentence vectors with a frozen transformer (:class:`.encoder.SentenceEncoder`,
the one encoding path). Nothing here knows about calibration or files.
"""
