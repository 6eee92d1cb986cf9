"""Integrations of seqkv into serving engines; each subpackage imports its engine only in the
one module that subclasses the engine's interface (``seqkv.integrations.vllm.connector``)."""
