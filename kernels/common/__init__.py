"""Building blocks shared by several ops: bit packing (``bitpack.py``, the stored format of every
quantizer's codes), fixed-order reductions, the Walsh-Hadamard butterfly and exact fp16
rounding (``naive.py``), and their Triton device functions (``triton.py``), which perform the
same IEEE operations in the same order.
"""
