"""The connector's settings, parsed from vLLM's ``kv_connector_extra_config`` (a JSON object).

Every key is optional; an unknown key or a value of the wrong type is refused by name
(``ConnectorConfigError``), so a typo never silently turns a tier off.

=====================  ==========================  ===============================================
key                    default                     meaning
=====================  ==========================  ===============================================
``warm_dir``           ``/tmp/seqkv-warm``         folder of the warm tier's entries (one a block)
``warm_budget_bytes``  1 GiB                       warm bytes kept; least recently used evicted
``warm_mode``          ``exact`` (see below)       ``exact``: the KV's own bits; ``lossy``: the
                                                   four keys below
``warm_bits``          3                           lossy: quantizer bits of warm entries
``warm_quantizer``     ``turboquant_mse``          lossy: any ``seqkv.quantizers`` name
``warm_predictor``     ``previous_token``          lossy: ``previous_token`` or ``none``
``warm_group``         16                          lossy: previous-token anchor spacing
``warm_default``       exact: ``true``,            load warm KV for requests that do not say
                       lossy: ``false``
``warm_save``          ``true``                    code full blocks into the warm tier
``warm_queue``         16                          save batches queued before new ones drop
``cold_store``         none (cold tier off)        ``dir:PATH`` or ``redis://HOST:PORT/DB``
``cold_queue``         64                          finished sessions queued for coding before
                                                   new ones drop (``seqkv_cold_status``)
``model_digest``       the model folder's digest   16 hex digits naming the weights
``counters_log_seconds`` 60                        log each side's counters this often (0: off)
=====================  ==========================  ===============================================

Per request (``SamplingParams(extra_args={"kv_transfer_params": {...}})``): ``seqkv_warm``
(bool: opt in to a lossy warm load, or out of an exact one), ``seqkv_tenant`` (str; else the
request's ``cache_salt``), ``seqkv_session`` (str, the cold tier's session id; else the request
id).

The default mode is ``exact``, chosen from the connector's table (``reports/vllm_connector.md``,
docs/guides/vllm.md): an exact load gives the engine the bits it computed, so its outputs are
those of a raw reload, and it stores fewer bytes than raw KV (1.19x float32, 1.48x bfloat16) and
loads far faster than a recompute. Every lossy mode measured under vLLM changed most greedy outputs
(3 bits: 96 of 100 continuations, the first difference 19 tokens in on average), so it cannot be
a default. Its entries are smaller (3-bit: 3.3x smaller than exact in bfloat16, 8x in float32):
choose it (``warm_mode: "lossy"``, or any lossy key) where capacity matters more than unchanged
outputs, and let requests opt in. A configuration that names a lossy key and no mode keeps the
lossy mode it had.

Invariants:
1. Parsing is total: every key is either used or refused; a lossy key beside
   ``warm_mode: "exact"`` is refused by name (enforced).
2. A lossy warm load happens only when the request or the operator asks (``warm_default``'s
   default is ``false`` in the lossy mode); an exact one, which changes no output, happens for
   every request that does not opt out (enforced; docs/guides/vllm.md says where warm loads
   do not win).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import get_args

import torch

from seqkv.delta.predictors import NoPrediction, PreviousToken
from seqkv.errors import ConnectorConfigError, SeqKVError
from seqkv.quantizers import QuantizerName
from seqkv.warm import EntryConfig, ExactConfig, WarmConfig, WarmMode
from seqkv.warm.config import WARM_MODES

DEFAULT_BUDGET = 1 << 30
"""1 GiB of warm entries: about 220,000 tokens of SmolLM2-135M at 3 bits."""
DEFAULT_MODE: WarmMode = "exact"
"""See the module docstring for why."""
_LOSSY_KEYS = ("warm_bits", "warm_quantizer", "warm_predictor", "warm_group")


@dataclass(frozen=True)
class ConnectorSettings:
    """Parsed ``kv_connector_extra_config``.

    >>> ConnectorSettings.parse({"warm_bits": 4}).coding(torch.bfloat16).label
    'previous-token (G=16) + turboquant_mse-4'
    >>> ConnectorSettings.parse({}).coding(torch.bfloat16).label
    'exact bfloat16'
    """

    warm_dir: str = "/tmp/seqkv-warm"
    warm_budget_bytes: int = DEFAULT_BUDGET
    warm_mode: WarmMode = DEFAULT_MODE
    warm: WarmConfig = field(default_factory=WarmConfig)
    """The lossy mode's coding (unused in the exact mode)."""
    warm_default: bool | None = None
    """Load for requests that do not say; ``None``: the mode's default (``loads_by_default``)."""
    warm_save: bool = True
    warm_queue: int = 16
    """Save batches (one per engine step) queued for coding before new ones are dropped."""
    cold_store: str | None = None
    cold_queue: int = 64
    """Finished sessions queued for the cold tier before new ones are dropped (a cold put codes
    every token: seconds to minutes on a slow CPU)."""
    model_digest: str | None = None
    counters_log_seconds: float = 60.0
    """Each side logs its counters at most this often (``counters.CounterLog``); 0: never."""

    def coding(self, kv_dtype: torch.dtype) -> EntryConfig:
        """What the warm entries of an engine whose KV is ``kv_dtype`` are coded with."""
        if self.warm_mode == "lossy":
            return self.warm
        try:
            return ExactConfig.of(kv_dtype)
        except SeqKVError as error:
            raise ConnectorConfigError(f"warm_mode 'exact': {error}") from None

    @property
    def loads_by_default(self) -> bool:
        """Whether a request that does not say (``seqkv_warm``) gets a warm load."""
        if self.warm_default is not None:
            return self.warm_default
        return self.warm_mode == "exact"

    @classmethod
    def parse(cls, extra: Mapping[str, object]) -> ConnectorSettings:
        known = {"warm_dir", "warm_budget_bytes", "warm_mode", *_LOSSY_KEYS, "warm_default",
                 "warm_save", "warm_queue", "cold_store", "cold_queue", "model_digest",
                 "counters_log_seconds"}
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ConnectorConfigError(
                f"kv_connector_extra_config has unknown keys {unknown}; seqkv's connector "
                f"reads {sorted(known)}"
            )

        def typed(key: str, kind: type, default: object) -> object:
            value = extra.get(key, default)
            if value is not None and (not isinstance(value, kind) or (
                    kind is int and isinstance(value, bool))):
                raise ConnectorConfigError(
                    f"kv_connector_extra_config[{key!r}] must be a {kind.__name__}, got "
                    f"{value!r}"
                )
            return value

        lossy_keys = [key for key in _LOSSY_KEYS if key in extra]
        mode = typed("warm_mode", str, "lossy" if lossy_keys else DEFAULT_MODE)
        if mode not in WARM_MODES:
            raise ConnectorConfigError(f"warm_mode {mode!r} is not one of {WARM_MODES}")
        if mode == "exact" and lossy_keys:
            raise ConnectorConfigError(
                f"warm_mode 'exact' stores the KV bit for bit; {lossy_keys} configure the lossy "
                "mode: remove them, or set warm_mode to 'lossy'"
            )
        quantizer = typed("warm_quantizer", str, "turboquant_mse")
        if quantizer not in get_args(QuantizerName):
            raise ConnectorConfigError(
                f"warm_quantizer {quantizer!r} is not one of {get_args(QuantizerName)}"
            )
        kind = typed("warm_predictor", str, "previous_token")
        group = typed("warm_group", int, 16)
        assert isinstance(group, int)
        try:
            if kind == "previous_token":
                predictor: NoPrediction | PreviousToken = PreviousToken(group)
            elif kind == "none":
                predictor = NoPrediction()
            else:
                raise ConnectorConfigError(
                    f"warm_predictor {kind!r} is not 'previous_token' or 'none'")
            bits = typed("warm_bits", int, 3)
            assert isinstance(bits, int)
            warm = WarmConfig(predictor, quantizer, bits)  # type: ignore[arg-type]
        except SeqKVError as error:
            raise ConnectorConfigError(f"kv_connector_extra_config: {error}") from None
        queue = typed("warm_queue", int, 16)
        assert isinstance(queue, int)
        if queue < 1:
            raise ConnectorConfigError(f"warm_queue must be >= 1, got {queue}")
        cold_queue = typed("cold_queue", int, 64)
        assert isinstance(cold_queue, int)
        if cold_queue < 1:
            raise ConnectorConfigError(f"cold_queue must be >= 1, got {cold_queue}")
        budget = typed("warm_budget_bytes", int, DEFAULT_BUDGET)
        assert isinstance(budget, int)
        if budget < 0:
            raise ConnectorConfigError(f"warm_budget_bytes must be >= 0, got {budget}")
        digest = typed("model_digest", str, None)
        assert digest is None or isinstance(digest, str)
        if digest is not None and (len(digest) != 16 or any(
                c not in "0123456789abcdef" for c in digest)):
            raise ConnectorConfigError(
                f"model_digest must be 16 lowercase hex digits, got {digest!r}")
        interval = extra.get("counters_log_seconds", 60.0)
        if isinstance(interval, bool) or not isinstance(interval, int | float) or not (
                0 <= interval < float("inf")):
            raise ConnectorConfigError(
                f"kv_connector_extra_config['counters_log_seconds'] must be a number >= 0, got "
                f"{interval!r}")
        default = typed("warm_default", bool, None)
        assert default is None or isinstance(default, bool)
        cold = typed("cold_store", str, None)
        assert cold is None or isinstance(cold, str)
        if cold is not None and not (cold.startswith("dir:") or cold.startswith("redis://")):
            raise ConnectorConfigError(
                f"cold_store must be 'dir:PATH' or 'redis://HOST:PORT/DB', got {cold!r}")
        return cls(
            warm_dir=str(typed("warm_dir", str, cls.warm_dir)),
            warm_budget_bytes=budget,
            warm_mode=mode,
            warm=warm,
            warm_default=default,
            warm_save=bool(typed("warm_save", bool, True)),
            warm_queue=queue,
            cold_store=cold,
            cold_queue=cold_queue,
            model_digest=digest,
            counters_log_seconds=float(interval),
        )


def check_parallelism(tensor: int, pipeline: int) -> None:
    """Refuse tensor or pipeline parallelism above 1 by name (a rank holds a share of the heads
    or layers, which the keys and the codec do not describe yet).

    >>> check_parallelism(1, 1)
    >>> check_parallelism(2, 1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    seqkv.errors.ConnectorConfigError: seqkv's connector does not support tensor parallelism ...
    """
    for name, size in (("tensor", tensor), ("pipeline", pipeline)):
        if size != 1:
            raise ConnectorConfigError(
                f"seqkv's connector does not support {name} parallelism yet (size {size}): "
                f"run with --{name}-parallel-size 1"
            )
