"""The rate-distortion sweep: every predictor x quantizer x bit budget on real text, against
the exact token codec, rendered as a markdown table and a PNG plot.

Motivation: the paper (arXiv 2604.15356) claims that predicting each KV vector from the model
and coding only the residual approaches the token-entropy floor. This sweep measures it on one
model and one text: bits per token position (all layers and heads, K and V, every stored bit
counted) against KV error, attention-output error and the model's next-token behaviour when it
continues from the decoded cache, with the compute each method needs.

Rows:
- ``delta``: one per (predictor, quantizer, budget, allocation) of the :class:`SweepGrid`;
  encode and (``verify_decode``) decode run in full, and the decoded KV must equal the encoder's
  bit for bit (``DecodeVerificationError`` otherwise).
- ``token_codec``: ``seqkv.compress(model, tokens, kv=prefill)`` at its default tolerance:
  the token code plus its coded residual, decoded with ``seqkv.decompress``.
- ``fp16``: the prefill KV rounded to float16 (184,320 bits/token on SmolLM2-135M).

Invariants:
1. Every row's ``bits_per_token`` is the coded size divided by the number of cached positions,
   side information and (for predictors that need them) token bits included (enforced: taken
   from ``DeltaCode.num_bits`` and ``CompressStats``).
2. Costs are measured, not modelled: forward calls and rows are counted by the predictors, and
   seconds are wall time on the machine that ran the sweep (enforced). Token decoding runs once
   and its cost is added to every row whose predictor needs the tokens.
3. The original cache is one prefill over the tokens (what a serving engine holds); all
   distortion figures compare against it (enforced).
4. Rendering has no global side effects: the plot uses matplotlib's object API with the Agg
   canvas, not ``pyplot`` (enforced).
"""

from __future__ import annotations

import importlib.resources
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypedDict

import torch

from seqkv.codec import DecodeItem, decode_many
from seqkv.delta.bit_allocation import AllocationMode
from seqkv.delta.delta_codec import (
    DeltaConfig,
    SurprisalProfile,
    TokenStore,
    decode_delta,
    encode_delta,
    store_tokens,
    surprisal_bits,
)
from seqkv.delta.metrics import ContinuationReference, Distortion, build_reference, measure
from seqkv.delta.predictors import (
    ExactRecompute,
    ForwardCost,
    NoPrediction,
    Predictor,
    PreviousToken,
    TopKExpectation,
)
from seqkv.delta.residual_coder import FIXED_WIDTHS
from seqkv.errors import DecodeVerificationError, InsufficientSamplesError
from seqkv.models.adapter import CausalLM
from seqkv.provenance import RunHeader, headed, start_run
from seqkv.quantizers import QuantizerName
from seqkv.skv import compress, decompress

PointKind = Literal["delta", "token_codec", "fp16"]

DEFAULT_PREFIX_TOKENS = 160
"""Cached positions of the default sweep: long enough for anchor groups and top-k statistics,
short enough for the whole default grid in about 18 minutes on 2 CPU cores."""
DEFAULT_CONTINUATION_TOKENS = 32


def _default_predictors() -> tuple[Predictor, ...]:
    return (NoPrediction(), PreviousToken(), PreviousToken(reference="anchor"),
            TopKExpectation(), ExactRecompute())


@dataclass(frozen=True)
class SweepGrid:
    """Which delta-coding methods the sweep runs.

    Fixed-width quantizers (int8, fp8) run once at their width with uniform allocation; the
    surprisal allocations run only for ``allocation_quantizers`` to keep the grid small.

    >>> len(SweepGrid().configs())
    65
    """

    predictors: tuple[Predictor, ...] = field(default_factory=_default_predictors)
    quantizers: tuple[QuantizerName, ...] = ("turboquant_mse", "kivi", "int8")
    budgets: tuple[int, ...] = (2, 3, 4)
    allocations: tuple[AllocationMode, ...] = (
        AllocationMode.UNIFORM, AllocationMode.SURPRISAL, AllocationMode.SURPRISAL_BUDGET)
    allocation_quantizers: tuple[QuantizerName, ...] = ("turboquant_mse",)
    seed: int = 0

    def configs(self) -> list[DeltaConfig]:
        out = []
        for predictor in self.predictors:
            for quantizer in self.quantizers:
                if quantizer in FIXED_WIDTHS:
                    out.append(DeltaConfig(predictor, quantizer, FIXED_WIDTHS[quantizer],
                                           AllocationMode.UNIFORM, self.seed))
                    continue
                modes = (self.allocations if quantizer in self.allocation_quantizers
                         else (AllocationMode.UNIFORM,))
                for budget in self.budgets:
                    for mode in modes:
                        out.append(DeltaConfig(predictor, quantizer, budget, mode, self.seed))
        return out


class RatePointJSON(TypedDict):
    kind: str
    method: str
    predictor: str
    quantizer: str
    allocation: str
    budget_bits: int | None
    mean_width: float | None
    bits_per_token: float
    payload_bits_per_token: float
    side_bits_per_token: float
    token_bits_per_token: float
    packed_bits_per_token: float | None
    residual_energy: float | None
    kv_mse: float
    kv_nmse: float
    attention_nmse: float
    kl_bits: float
    perplexity_original: float
    perplexity_decoded: float
    encode_calls: int
    encode_rows: int
    encode_seconds: float
    decode_calls: int
    decode_rows: int
    decode_seconds: float | None


@dataclass(frozen=True)
class RatePoint:
    """One method's rate, distortion and compute on the sweep's text."""

    kind: PointKind
    predictor: str
    quantizer: str
    allocation: str
    budget_bits: int | None
    mean_width: float | None
    """Mean nominal code width over positions (differs from the budget under the paper's rule)."""
    bits_per_token: float
    """Everything stored, per cached token position (all layers, heads, K and V)."""
    payload_bits_per_token: float
    """Entropy-coded quantizer codes (token codec: its residual code)."""
    side_bits_per_token: float
    """Quantizer side information, fitted tables, stored widths."""
    token_bits_per_token: float
    packed_bits_per_token: float | None
    """The same method with the codes stored packed instead of entropy-coded."""
    residual_energy: float | None
    """``||KV - prediction||^2 / ||KV||^2``."""
    distortion: Distortion
    encode_cost: ForwardCost
    encode_seconds: float
    decode_cost: ForwardCost
    decode_seconds: float | None

    @property
    def method(self) -> str:
        if self.kind != "delta":
            return self.predictor
        budget = f"-{self.budget_bits}" if self.budget_bits is not None else ""
        alloc = "" if self.allocation == AllocationMode.UNIFORM.value else f", {self.allocation}"
        return f"{self.predictor} + {self.quantizer}{budget}{alloc}"

    def to_json_dict(self) -> RatePointJSON:
        d = self.distortion
        return RatePointJSON(
            kind=self.kind, method=self.method, predictor=self.predictor,
            quantizer=self.quantizer, allocation=self.allocation, budget_bits=self.budget_bits,
            mean_width=self.mean_width, bits_per_token=self.bits_per_token,
            payload_bits_per_token=self.payload_bits_per_token,
            side_bits_per_token=self.side_bits_per_token,
            token_bits_per_token=self.token_bits_per_token,
            packed_bits_per_token=self.packed_bits_per_token,
            residual_energy=self.residual_energy, kv_mse=d.kv_mse, kv_nmse=d.kv_nmse,
            attention_nmse=d.attention_nmse, kl_bits=d.kl_bits,
            perplexity_original=d.perplexity_original,
            perplexity_decoded=d.perplexity_decoded,
            encode_calls=self.encode_cost.calls, encode_rows=self.encode_cost.rows,
            encode_seconds=self.encode_seconds, decode_calls=self.decode_cost.calls,
            decode_rows=self.decode_cost.rows, decode_seconds=self.decode_seconds,
        )


@dataclass(frozen=True)
class _Shared:
    """What every row of one sweep reuses: surprisal, the token code, its decode cost."""

    surprisal: SurprisalProfile | None
    token_store: TokenStore | None
    token_decode_cost: ForwardCost
    token_decode_seconds: float


def _delta_point(
    model: CausalLM,
    tokens: list[int],
    original: torch.Tensor,
    config: DeltaConfig,
    reference: ContinuationReference,
    shared: _Shared,
    verify_decode: bool,
) -> RatePoint:
    needs_tokens = config.predictor.needs_tokens
    encoded = encode_delta(model, tokens, original, config, surprisal=shared.surprisal,
                           token_store=shared.token_store if needs_tokens else None)
    decode_seconds: float | None = None
    decode_cost = ForwardCost()
    if verify_decode:
        decoded = decode_delta(model, encoded.code, tokens=tokens if needs_tokens else None)
        if not torch.equal(decoded.kv, encoded.decoded):
            raise DecodeVerificationError(
                f"{config.label}: the decoder did not rebuild the encoder's KV bit for bit"
            )
        decode_seconds = decoded.seconds
        decode_cost = decoded.cost
        if needs_tokens:
            decode_seconds += shared.token_decode_seconds
            decode_cost += shared.token_decode_cost
    code = encoded.code
    parts = code.breakdown
    count = code.num_tokens
    packed_total = parts.total - parts.payload - parts.tables + code.packed_code_bits
    return RatePoint(
        kind="delta",
        predictor=config.predictor.label,
        quantizer=config.quantizer,
        allocation=config.allocation.value,
        budget_bits=config.budget_bits,
        mean_width=sum(code.widths) / count,
        bits_per_token=parts.total / count,
        payload_bits_per_token=parts.payload / count,
        side_bits_per_token=(parts.side + parts.tables + parts.widths) / count,
        token_bits_per_token=parts.tokens / count,
        packed_bits_per_token=packed_total / count,
        residual_energy=encoded.residual_energy,
        distortion=measure(model, reference, encoded.decoded),
        encode_cost=encoded.cost,
        encode_seconds=encoded.seconds,
        decode_cost=decode_cost,
        decode_seconds=decode_seconds,
    )


def run_rate_distortion_sweep(
    model: CausalLM,
    tokens: Sequence[int],
    continuation: Sequence[int],
    grid: SweepGrid | None = None,
    *,
    verify_decode: bool = True,
    include_references: bool = True,
    log: Callable[[str], None] | None = None,
) -> list[RatePoint]:
    """Run every method of ``grid`` on the prefill KV of ``tokens``; see the module docstring.

    ``continuation`` (>= 2 tokens) is the held-out text the model continues with from each
    decoded cache. ``log`` receives one line per finished row.
    """
    token_list = [int(t) for t in tokens]
    model.check_tokens(token_list)
    grid = SweepGrid() if grid is None else grid
    original = model.kv_tensor(model.prefill(token_list))  # [L, 2, H, T, D]
    reference = build_reference(model, original, continuation)
    points: list[RatePoint] = []

    def emit(point: RatePoint) -> None:
        points.append(point)
        if log is not None:
            log(f"{point.method}: {point.bits_per_token:,.1f} bits/token, KV MSE "
                f"{point.distortion.kv_mse:.3g}, KL {point.distortion.kl_bits:.3g} bits, "
                f"encode {point.encode_seconds:.1f} s")

    if include_references:
        emit(_fp16_point(model, original, reference))
        emit(_token_codec_point(model, token_list, original, reference))
    configs = grid.configs()
    surprisal = (surprisal_bits(model, token_list)
                 if any(c.allocation is not AllocationMode.UNIFORM for c in configs) else None)
    token_store = None
    token_decode_cost = ForwardCost()
    token_decode_seconds = 0.0
    if any(c.predictor.needs_tokens for c in configs):
        token_store = store_tokens(model, token_list)
        started = time.perf_counter()
        if decode_many(model, [DecodeItem(token_store.session)])[0].tokens != token_list:
            raise DecodeVerificationError("the token codec did not return the tokens")
        token_decode_seconds = time.perf_counter() - started
        token_decode_cost = token_store.cost
    shared = _Shared(surprisal, token_store, token_decode_cost, token_decode_seconds)
    for config in configs:
        emit(_delta_point(model, token_list, original, config, reference, shared, verify_decode))
    return points


def _fp16_point(model: CausalLM, original: torch.Tensor,
                reference: ContinuationReference) -> RatePoint:
    bits = 16.0 * model.kv_components_per_token
    return RatePoint(
        kind="fp16", predictor="fp16 KV", quantizer="fp16", allocation="-", budget_bits=16,
        mean_width=16.0, bits_per_token=bits, payload_bits_per_token=bits,
        side_bits_per_token=0.0, token_bits_per_token=0.0, packed_bits_per_token=bits,
        residual_energy=None,
        distortion=measure(model, reference, original.half().float()),
        encode_cost=ForwardCost(), encode_seconds=0.0, decode_cost=ForwardCost(),
        decode_seconds=0.0,
    )


def _token_codec_point(model: CausalLM, tokens: list[int], original: torch.Tensor,
                       reference: ContinuationReference) -> RatePoint:
    result = compress(model, tokens, kv=original)
    decoded = decompress(model, result.data)
    stats = result.stats
    count = stats.tokens
    calls = count + (model.start_token_id is not None)
    return RatePoint(
        kind="token_codec", predictor="exact token codec (seqkv.compress)", quantizer="-",
        allocation="-", budget_bits=None, mean_width=None,
        bits_per_token=stats.payload_bits_per_token,
        payload_bits_per_token=stats.residual_bits / count, side_bits_per_token=0.0,
        token_bits_per_token=stats.bits_per_token, packed_bits_per_token=None,
        residual_energy=None, distortion=measure(model, reference, decoded.kv),
        encode_cost=ForwardCost(calls, calls), encode_seconds=stats.encode_seconds,
        decode_cost=ForwardCost(calls, calls), decode_seconds=decoded.stats.decode_seconds,
    )


@dataclass(frozen=True)
class SweepSetting:
    """What the report says about how the sweep was run."""

    model_name: str
    num_tokens: int
    num_continuation: int
    components_per_token: int
    source: str
    seconds: float


def _fmt(value: float | None, spec: str = ".3g") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


_PREDICTOR_ORDER = ("fp16", "exact token codec", "none", "previous-token", "anchor-delta",
                    "top-k", "exact recompute")


_ALLOCATION_ORDER = tuple(mode.value for mode in AllocationMode)


def _sort_key(point: RatePoint) -> tuple[int, str, str, int, int]:
    rank = next((i for i, p in enumerate(_PREDICTOR_ORDER) if point.predictor.startswith(p)),
                len(_PREDICTOR_ORDER))
    allocation = (_ALLOCATION_ORDER.index(point.allocation)
                  if point.allocation in _ALLOCATION_ORDER else -1)
    return (rank, point.predictor, point.quantizer, allocation, point.budget_bits or 0)


def render_markdown(points: Sequence[RatePoint], setting: SweepSetting) -> str:
    """The sweep as a markdown report: setting, definitions, one table row per point."""
    lines = [
        "# Rate-distortion of predictive delta coding (seqkv.delta)",
        "",
        f"Model **{setting.model_name}**; {setting.num_tokens} cached tokens of "
        f"{setting.source}, {setting.num_continuation}-token held-out continuation; "
        f"{setting.components_per_token:,} KV components per token position. "
        f"Sweep time {setting.seconds:,.0f} s.",
        "",
        "- **bits/tok**: every stored bit per cached token position (all layers and heads, K and "
        "V): entropy-coded codes, quantizer side information, fitted tables, per-position widths, "
        "and the token code when the predictor needs the tokens (**tok bits**). **packed**: the "
        "same with the codes stored packed (no entropy coding).",
        "- **resid**: `||KV - prediction||^2 / ||KV||^2` over the whole cache (closed loop).",
        "- **KV MSE** vs the prefill KV; **attn NMSE**: attention output of the continuation's "
        "real queries over the cached positions, decoded vs original, relative squared error; "
        "**KL**: mean next-token KL(original || decoded) in bits over the continuation; "
        "**PPL**: continuation perplexity from the decoded cache (original in the header).",
        "- **enc/dec fwd**: model forward calls / token rows (a batch of k candidates is 1 call, k "
        "rows), token coding and decoding included; seconds are wall time on this machine.",
        "",
    ]
    if points:
        lines.append(f"Continuation perplexity from the original cache: "
                     f"{points[0].distortion.perplexity_original:.4f}.")
        lines.append("")
    header = ("| method | b0 | mean b | bits/tok | tok bits | packed | resid | KV MSE | "
              "attn NMSE | KL (bits) | PPL | enc fwd | enc s | dec fwd | dec s |")
    lines += [header,
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in sorted(points, key=_sort_key):
        d = p.distortion
        lines.append(
            f"| {p.method} | {_fmt(p.budget_bits, 'd') if p.budget_bits is not None else '-'} "
            f"| {_fmt(p.mean_width, '.2f')} | {p.bits_per_token:,.1f} "
            f"| {p.token_bits_per_token:.2f} | {_fmt(p.packed_bits_per_token, ',.1f')} "
            f"| {_fmt(p.residual_energy)} | {d.kv_mse:.3g} | {d.attention_nmse:.3g} "
            f"| {d.kl_bits:.3g} | {d.perplexity_decoded:.3f} "
            f"| {p.encode_cost.calls}/{p.encode_cost.rows} | {p.encode_seconds:.1f} "
            f"| {p.decode_cost.calls}/{p.decode_cost.rows} | {_fmt(p.decode_seconds, '.1f')} |"
        )
    return "\n".join(lines) + "\n"


_MARKERS: dict[str, str] = {"turboquant_mse": "o", "turboquant_prod": "D", "kivi": "s",
                            "int8": "^", "fp8": "v"}
_FLOOR = 1e-16
"""Values below this are drawn at it on the log axes (the token codec's KL is ~0)."""


def render_plot(points: Sequence[RatePoint], path: Path, setting: SweepSetting) -> None:
    """Two log-log panels, KV MSE and next-token KL against bits per token, written to ``path``.

    Colours are predictors, markers quantizers; hollow markers are the surprisal allocations.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 5.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 2)
    predictors = sorted({p.predictor for p in points if p.kind == "delta"},
                        key=lambda name: _sort_key(next(q for q in points if q.predictor == name)))
    palette = [f"C{i}" for i in range(10)]
    colours = {name: palette[i % len(palette)] for i, name in enumerate(predictors)}
    metrics: tuple[tuple[str, Callable[[RatePoint], float]], ...] = (
        ("KV mean squared error", lambda p: p.distortion.kv_mse),
        ("next-token KL (bits), continuation from the decoded cache",
         lambda p: p.distortion.kl_bits),
    )
    for ax, (title, value) in zip(axes, metrics, strict=True):
        for point in points:
            y = max(value(point), _FLOOR)
            if point.kind == "delta":
                colour = colours[point.predictor]
                hollow = point.allocation != AllocationMode.UNIFORM.value
                ax.scatter(point.bits_per_token, y, marker=_MARKERS.get(point.quantizer, "o"),
                           facecolors="none" if hollow else colour, edgecolors=colour, s=36)
            else:
                marker = "*" if point.kind == "token_codec" else "P"
                ax.scatter(point.bits_per_token, y, marker=marker, color="black", s=140,
                           zorder=3)
                ax.annotate(point.predictor, (point.bits_per_token, y), fontsize=8,
                            xytext=(6, 4), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("bits per token position (all layers, heads, K and V)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
    handles = [axes[0].scatter([], [], color=colours[name], marker="o") for name in predictors]
    labels = list(predictors)
    for quantizer in sorted({p.quantizer for p in points if p.kind == "delta"}):
        handles.append(axes[0].scatter([], [], color="grey",
                                       marker=_MARKERS.get(quantizer, "o")))
        labels.append(quantizer)
    handles.append(axes[0].scatter([], [], facecolors="none", edgecolors="grey", marker="o"))
    labels.append("surprisal allocation (hollow)")
    axes[1].legend(handles, labels, fontsize=8, loc="best")
    figure.suptitle(f"{setting.model_name}: {setting.num_tokens} tokens of {setting.source}; "
                    f"values below {_FLOOR:g} drawn at {_FLOOR:g}", fontsize=10)
    figure.savefig(path, dpi=120)


@dataclass(frozen=True)
class ReportPaths:
    markdown: Path
    plot: Path


def write_reports(points: Sequence[RatePoint], directory: Path,
                  setting: SweepSetting, header: RunHeader) -> ReportPaths:
    """Write ``rate_distortion.md`` (under the run's ``header``) and ``rate_distortion.png``
    into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = ReportPaths(directory / "rate_distortion.md", directory / "rate_distortion.png")
    paths.markdown.write_text(headed(render_markdown(points, setting), header.finished()),
                              encoding="utf-8")
    render_plot(points, paths.plot, setting)
    return paths


def sample_inputs(model: CausalLM, prefix_tokens: int = DEFAULT_PREFIX_TOKENS,
                  continuation_tokens: int = DEFAULT_CONTINUATION_TOKENS
                  ) -> tuple[list[int], list[int]]:
    """The first ``prefix_tokens`` tokens of the shipped sample text and the held-out
    continuation that follows them."""
    text = (importlib.resources.files("seqkv") / "data" / "sample.txt").read_text("utf-8")
    ids = model.encode_text(text)
    if prefix_tokens < 1 or continuation_tokens < 2:
        raise InsufficientSamplesError("need prefix_tokens >= 1 and continuation_tokens >= 2")
    if prefix_tokens + continuation_tokens > len(ids):
        raise InsufficientSamplesError(
            f"the sample text has {len(ids)} tokens, fewer than {prefix_tokens} + "
            f"{continuation_tokens}"
        )
    return ids[:prefix_tokens], ids[prefix_tokens:prefix_tokens + continuation_tokens]


def run_default_sweep(
    model: CausalLM,
    directory: Path | None = None,
    prefix_tokens: int = DEFAULT_PREFIX_TOKENS,
    continuation_tokens: int = DEFAULT_CONTINUATION_TOKENS,
    grid: SweepGrid | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[list[RatePoint], SweepSetting]:
    """The sweep on the shipped sample text; writes the reports when ``directory`` is given."""
    tokens, continuation = sample_inputs(model, prefix_tokens, continuation_tokens)
    header = start_run(model.name, f"src/seqkv/data/sample.txt: {len(tokens)} cached tokens, "
                                   f"{len(continuation)} held out")
    started = time.perf_counter()
    points = run_rate_distortion_sweep(model, tokens, continuation, grid, log=log)
    setting = SweepSetting(model.name, len(tokens), len(continuation),
                           model.kv_components_per_token, "src/seqkv/data/sample.txt",
                           time.perf_counter() - started)
    if directory is not None:
        write_reports(points, directory, setting, header)
    return points, setting
