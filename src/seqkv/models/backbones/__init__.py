"""One ``Backbone`` per decoder architecture behind seqkv's own forward drivers (see ``base``)."""

from seqkv.models.backbones.base import Attend, Backbone, BackboneGeometry
from seqkv.models.backbones.gpt_neox import GPTNeoXBackbone
from seqkv.models.backbones.llama import LlamaBackbone
from seqkv.models.backbones.registry import FAMILIES, backbone_for

__all__ = [
    "FAMILIES",
    "Attend",
    "Backbone",
    "BackboneGeometry",
    "GPTNeoXBackbone",
    "LlamaBackbone",
    "backbone_for",
]
