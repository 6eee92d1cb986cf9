"""Building blocks shared by several ops: fixed-order reductions, the Walsh-Hadamard butterfly,
bit packing and exact rounding, each as a torch reference (``naive``) and a Triton device
function (``triton``) that performs the same IEEE operations in the same order.
"""
