"""``seqkv doctor``: where seqkv runs on this machine, and what that means for its figures.

It reports (``--json``: one object with these keys):

* ``integer_isa``, ``integer_isas``, ``integer_forced``, ``integer_reason``: the instruction set
  of native.c that the integer forward (the ``portable`` levels) runs on, the paths this CPU
  runs (best first), ``$SEQKV_INTEGER_ISA`` and why that path; ``integer_isa`` is null where the
  torch statement runs (``$SEQKV_INTEGER_BACKEND=torch``, or no C compiler);
* ``cpu``: the CPU's vendor, family and model;
* ``float_profile``, ``float_figures_gated``, ``float_nearest_profile``: the float levels'
  profile (what decides their bits: ``seqkv.bench.figures.FloatProfile``), whether the figures
  gate holds a baseline for it (else their figures are reported, not gated, on this machine)
  and the nearest recorded profile;
* ``model_cache``, ``model_cached``: the converted-model cache's folder (null when off) and
  whether the embedded model's converted copy was in it before this run (null for
  ``--model`` or with the cache off);
* ``redis_server``: the ``redis-server`` the store's Redis tests and ``scripts/redis.sh`` use,
  or null where it is not installed.

The float profile needs the model (its row-invariant block is calibrated on this machine), so
doctor loads it, as every model verb does.
"""

from __future__ import annotations

import argparse
import shutil

from seqkv.bench.figures import (
    baselines_root,
    float_baseline_path,
    float_baselines,
    float_profile,
    nearest_baseline,
)
from seqkv.cli import common
from seqkv.models import gguf_cache
from seqkv.models.integer import native
from seqkv.models.loading import default_model_file
from seqkv.schedule import cpu_model


def _cmd_doctor(args: argparse.Namespace) -> int:
    status = native.status()
    cache = gguf_cache.cache_root()
    cached: bool | None = None  # before the load, which fills the cache
    if cache is not None and args.model is None:
        cached = (cache / gguf_cache.cache_key(default_model_file())).is_dir()
    model = common.load_for(args)
    profile = float_profile(model)
    root = baselines_root()
    gated = float_baseline_path(root, profile).exists()
    nearest = None if gated else nearest_baseline(profile, float_baselines(root))
    figures: dict[str, object] = {
        "integer_isa": status.isa,
        "integer_isas": list(status.cpu),
        "integer_forced": status.forced,
        "integer_reason": status.reason,
        "cpu": cpu_model(),
        "float_profile": profile.key,
        "float_figures_gated": gated,
        "float_nearest_profile": None if nearest is None or nearest.profile is None
        else nearest.profile.key,
        "model_cache": None if cache is None else str(cache),
        "model_cached": cached,
        "redis_server": shutil.which("redis-server"),
    }
    common.print_figures(figures, args.json, "seqkv doctor")
    return 0


def add_doctor(commands: common.Subparsers) -> None:
    doctor = commands.add_parser(
        "doctor", help="where seqkv runs here: the integer path, the float profile and its "
                       "figures gate, the model cache, Redis")
    common.model_option(doctor)
    common.json_option(doctor)
    common.progress_option(doctor)
    doctor.set_defaults(run=_cmd_doctor)
