"""The regression gates of ``seqkv bench``: deterministic figures (``figures``) and timing
ratios (``timing``), and the shipped texts they code. The measurements behind the reports live
outside the package (``research/bench``)."""
