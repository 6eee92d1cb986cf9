"""Byte layouts of seqkv's values, one module per format.

``framing`` (the envelope every format shares), ``skv`` and ``skv_legacy`` (the ``.skv`` file),
``span`` (the store's span record), ``residual`` (the KV residual's section both hold).

Invariants:
1. Importing the package loads no format module and computes nothing (enforced: this file holds
   no import), so reading one format does not load the others' dependencies.
2. It is a regular package (this file), so setuptools' package discovery ships it in a wheel
   (checked: ``tests/test_packaging.py``).
"""
