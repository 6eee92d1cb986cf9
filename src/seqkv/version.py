"""The seqkv release, recorded in every .skv file it writes."""

__version__ = "0.1.0"
