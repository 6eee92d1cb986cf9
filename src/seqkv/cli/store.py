"""``seqkv store``: sessions kept in a shared store (a directory or Redis), one verb per action.

``--store dir:PATH`` (the default, ``dir:seqkv-store``: no server) or
``--store redis://HOST:PORT/DB`` names the store; ``--namespace`` the tenant (default
``default``). Texts are tokenized with the model; ``put-many`` / ``get-many`` read and write
JSON lines (``{"id": ..., "text" or "tokens": ..., "namespace": ...}``) with a progress bar.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file

from seqkv.cli import common
from seqkv.errors import SeqKVError
from seqkv.levels import DEFAULT_LEVEL
from seqkv.models import CausalLM
from seqkv.store import SessionStore, skv_codecs
from seqkv.store.directory import DirectoryBackend
from seqkv.store.jobs import get_many_jsonl, put_many_jsonl
from seqkv.store.redis_backend import RedisBackend

DEFAULT_STORE = "dir:seqkv-store"


class StoreLocationError(SeqKVError, ValueError):
    """A ``--store`` that is neither ``dir:PATH`` nor ``redis://HOST:PORT/DB``."""


def open_store(location: str, model: CausalLM) -> SessionStore:
    """The store ``location`` names, coding with ``model``."""
    if location.startswith("dir:") and len(location) > 4:
        return SessionStore(DirectoryBackend(location[4:]), skv_codecs(model))
    if location.startswith(("redis://", "rediss://", "unix://")):
        return SessionStore(RedisBackend(location), skv_codecs(model))
    raise StoreLocationError(
        f"--store {location!r}: write dir:PATH for a local folder or redis://HOST:PORT/DB")


def _store(args: argparse.Namespace) -> tuple[SessionStore, CausalLM]:
    model = common.load(args.model)
    return open_store(args.store, model), model


def _cmd_put(args: argparse.Namespace) -> int:
    store, model = _store(args)
    tokens = model.encode_text(common.read_text(args.text))
    kv = model.prefill(tokens) if args.kv == "prefill" else None
    result = store.put(args.session_id, tokens, kv, level=args.level.spec.name,
                       namespace=args.namespace)
    common.print_figures(asdict(result), args.json, f"stored {args.session_id}")
    return 0


def _cmd_get(args: argparse.Namespace) -> int:
    store, model = _store(args)
    session = store.get(args.session_id, namespace=args.namespace)
    common.write_text(args.output, model.decode_tokens(list(session.tokens)))
    if args.kv_out and session.kv is not None:
        kv = session.kv  # [L, 2, H, T, D]
        save_file({"keys": kv[:, 0].contiguous(), "values": kv[:, 1].contiguous(),
                   "tokens": torch.tensor(list(session.tokens), dtype=torch.int64)},
                  args.kv_out, metadata={"model": model.name,
                                         "layout": "[layers, kv_heads, tokens, head_dim]"})
    if args.output != "-" or args.json:
        common.print_figures({"session": args.session_id, "tokens": len(session.tokens),
                              "kv_exact": session.kv_exact}, args.json,
                             f"restored {args.session_id}")
    return 0


def _cmd_ls(args: argparse.Namespace) -> int:
    store, _ = _store(args)
    names = sorted(str(name) for name in store.list(namespace=args.namespace))
    if args.json:
        print(json.dumps(names))
    else:
        print("\n".join(names))
    return 0


def _cmd_stat(args: argparse.Namespace) -> int:
    store, _ = _store(args)
    if args.session_id is None:
        figures = asdict(store.byte_counts(namespace=args.namespace))
    else:
        figures = asdict(store.stat(args.session_id, namespace=args.namespace))
    common.print_figures(figures, args.json, "store statistics")
    return 0


def _cmd_gc(args: argparse.Namespace) -> int:
    store, _ = _store(args)
    common.print_figures(asdict(store.gc(namespace=args.namespace)), args.json, "garbage collected")
    return 0


def _cmd_put_many(args: argparse.Namespace) -> int:
    store, model = _store(args)
    report = put_many_jsonl(store, args.sessions, level=args.level.spec.name,
                            tokenize=model.encode_text, progress=not args.json)
    common.print_figures(asdict(report), args.json, f"stored the sessions of {args.sessions}")
    return 0


def _cmd_get_many(args: argparse.Namespace) -> int:
    store, model = _store(args)
    report = get_many_jsonl(store, args.sessions, Path(args.output),
                            detokenize=model.decode_tokens, progress=not args.json)
    common.print_figures(asdict(report), args.json, f"restored the sessions of {args.sessions}")
    return 0


def add_store(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    store = commands.add_parser("store", help="sessions in a shared store: put, get, append "
                                               "turns, list, statistics, garbage collection")
    verbs = store.add_subparsers(dest="store_verb", required=True)

    def common_options(command: argparse.ArgumentParser) -> None:
        command.add_argument("--store", default=DEFAULT_STORE, metavar="LOCATION",
                             help="dir:PATH or redis://HOST:PORT/DB (default "
                                  f"{DEFAULT_STORE})")
        command.add_argument("--namespace", default="default",
                             help="the tenant (default \"default\")")
        common.model_option(command)
        common.json_option(command)

    def level_option(command: argparse.ArgumentParser) -> None:
        command.add_argument("--level", type=common.level_argument,
                             default=common.level_argument("rows"), metavar="LEVEL",
                             help=f"coding level (default rows; {DEFAULT_LEVEL} codes fewest "
                                  "bits but decodes one token per forward)")

    put = verbs.add_parser("put", help="store a text (and its prefill KV) as a session")
    put.add_argument("session_id", metavar="SESSION_ID")
    put.add_argument("text", metavar="TEXT", help="UTF-8 text file, or - for stdin")
    put.add_argument("--kv", choices=["prefill", "none"], default="prefill",
                     help="store the KV of one prefill over the text (default) or tokens only")
    level_option(put)
    common_options(put)
    put.set_defaults(run=_cmd_put)

    get = verbs.add_parser("get", help="restore a session's text (and KV)")
    get.add_argument("session_id", metavar="SESSION_ID")
    get.add_argument("-o", "--output", required=True, metavar="TEXT", help="text file, or -")
    get.add_argument("--kv-out", metavar="KV.safetensors", help="also write the KV cache")
    common_options(get)
    get.set_defaults(run=_cmd_get)

    ls = verbs.add_parser("ls", help="list the sessions of a namespace")
    common_options(ls)
    ls.set_defaults(run=_cmd_ls)

    stat = verbs.add_parser("stat", help="a session's bytes and tokens, or the namespace's")
    stat.add_argument("session_id", metavar="SESSION_ID", nargs="?")
    common_options(stat)
    stat.set_defaults(run=_cmd_stat)

    gc = verbs.add_parser("gc", help="remove what no session needs any more")
    common_options(gc)
    gc.set_defaults(run=_cmd_gc)

    put_many = verbs.add_parser("put-many", help="store every session of a JSON-lines file")
    put_many.add_argument("sessions", metavar="SESSIONS.jsonl")
    level_option(put_many)
    common_options(put_many)
    put_many.set_defaults(run=_cmd_put_many)

    get_many = verbs.add_parser("get-many", help="restore the sessions a JSON-lines file lists, "
                                                  "sharing forwards")
    get_many.add_argument("sessions", metavar="SESSIONS.jsonl")
    get_many.add_argument("-o", "--output", required=True, metavar="OUT.jsonl")
    common_options(get_many)
    get_many.set_defaults(run=_cmd_get_many)
