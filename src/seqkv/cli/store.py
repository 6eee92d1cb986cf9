"""``seqkv store``: sessions kept in a shared store (a directory or Redis), one verb per action.

``--store dir:PATH`` (the default, ``dir:seqkv-store``: no server) or
``--store redis://HOST:PORT/DB`` names the store; ``--namespace`` the tenant (default
``default``). Texts are tokenized with the model; ``put-many`` / ``get-many`` read and write
JSON lines (``{"id": ..., "text" or "tokens": ..., "namespace": ...}``) with a progress bar.

Sessions are coded at ``portable`` unless ``--level`` says otherwise. The store keeps
mixing dictionaries per namespace: ``dict-put DICT`` stores a dictionary built for the
namespace (``seqkv dict build --namespace NS``) and makes it current, and ``put --level
portable+mix`` codes with it; ``get`` finds each span's dictionary in the same namespace.
``dict-ls`` lists the namespace's dictionaries and names the current one.

``audit`` recounts the namespace's references (exit status 1 when they do not add up or a row is
malformed, an unbound row the legacy list does not hold included); ``audit --deep`` also decodes
every session and names the damaged ones (an unbound row the upgrade from schema 1 did not list
as it is among them) and the unbound ones (rows of a store written before schema 2 that the
legacy list holds, read but not checked against a binding), exit status 1 on any damage. ``gc``
refuses a namespace whose audit finds malformed rows. ``get --max-tokens N`` refuses a session
claiming more than N tokens (default: the model's context) before any forward. ``stat SESSION``
decodes nothing: it checks the row, its chain and its length against its last span, and the
binding only where the row ends at that span's last token (``binding_checked``); ``get`` and
``audit --deep`` check the rest.
"""

from __future__ import annotations

import argparse
import json
import urllib.parse
from dataclasses import asdict

from seqkv.cli import common
from seqkv.cli.sessions import kv_file_bytes
from seqkv.errors import OutputError, SeqKVError
from seqkv.files import atomic_output
from seqkv.limits import MAX_POSITIONS
from seqkv.mixing.dictionary import Dictionary
from seqkv.mixing.errors import DictionaryMismatchError
from seqkv.models import CausalLM
from seqkv.store import DEFAULT_STORE_LEVEL, SessionStore, model_codecs
from seqkv.store.backends.directory import DirectoryBackend
from seqkv.store.backends.redis import RedisBackend
from seqkv.store.jobs import get_many_jsonl, put_many_jsonl

DEFAULT_STORE = "dir:seqkv-store"
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


class StoreLocationError(SeqKVError, ValueError):
    """A ``--store`` that is neither ``dir:PATH`` nor ``redis://HOST:PORT/DB``."""


def open_store(location: str, model: CausalLM) -> SessionStore:
    """The store ``location`` names, coding with ``model``."""
    if location.startswith("dir:") and len(location) > 4:
        return SessionStore(DirectoryBackend(location[4:]), model_codecs(model))
    if location.startswith(_REDIS_SCHEMES):
        _check_redis_url(location)
        try:
            backend = RedisBackend(location)
        except ValueError as error:  # redis-py's URL parsing
            raise StoreLocationError(f"--store {location!r}: {error}") from None
        return SessionStore(backend, model_codecs(model))
    raise StoreLocationError(
        f"--store {location!r}: write dir:PATH for a local folder or redis://HOST:PORT/DB")


def _check_redis_url(location: str) -> None:
    """Refuse a Redis URL whose port or database is not a number, before redis-py's parser
    raises a plain ValueError."""
    if location.startswith("unix://"):
        return
    try:
        parts = urllib.parse.urlsplit(location)
        parts.port  # noqa: B018  (parsing it is the check)
    except ValueError as error:
        raise StoreLocationError(f"--store {location!r}: {error}: write "
                                 "redis://HOST:PORT/DB") from None
    database = parts.path.strip("/")
    if database and not (database.isascii() and database.isdigit()):
        raise StoreLocationError(f"--store {location!r}: the database {database!r} is not a "
                                 "number: write redis://HOST:PORT/DB")


def location_argument(text: str) -> str:
    """A ``--store`` value of a form ``open_store`` accepts."""
    if text.startswith(_REDIS_SCHEMES):
        try:
            _check_redis_url(text)
        except StoreLocationError as error:
            raise argparse.ArgumentTypeError(str(error).removeprefix("--store ")) from None
        return text
    if text.startswith("dir:") and len(text) > 4:
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r}: write dir:PATH for a local folder or redis://HOST:PORT/DB")


def _store(args: argparse.Namespace) -> tuple[SessionStore, CausalLM]:
    common.reporter_of(args).phase("load the model")
    model = common.load_for(args)
    common.reporter_of(args).phase("open the store")
    return open_store(args.store, model), model


def _cmd_put(args: argparse.Namespace) -> int:
    store, model = _store(args)
    tokens = model.encode_text(common.read_text(args.text, common.text_limit(model)))
    model.check_tokens(tokens)
    kv = model.prefill(tokens) if args.kv == "prefill" else None
    result = store.put(args.session_id, tokens, kv, level=args.level.spec.name,
                       namespace=args.namespace)
    common.print_figures(asdict(result), args.json, f"stored {args.session_id}")
    return 0


def _cmd_get(args: argparse.Namespace) -> int:
    store, model = _store(args)
    session = store.get(args.session_id, namespace=args.namespace, max_tokens=args.max_tokens)
    tokens = list(session.tokens)
    outputs = [(args.output, model.decode_tokens(tokens).encode("utf-8"))]
    if args.kv_out and session.kv is not None:
        outputs.append((args.kv_out, kv_file_bytes(session.kv, tokens, model.name)))
    common.write_outputs(outputs)
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


def _cmd_audit(args: argparse.Namespace) -> int:
    store, _ = _store(args)
    if not args.deep:
        report = store.audit(namespace=args.namespace)
        common.print_figures({**asdict(report), "consistent": report.consistent}, args.json,
                             f"audit of {args.namespace}")
        return 0 if report.consistent else 1
    deep = store.audit_deep(namespace=args.namespace, max_tokens=args.max_tokens)
    if args.json:
        print(json.dumps({"sessions": deep.sessions, "consistent": deep.consistent,
                          "damaged": [asdict(d) for d in deep.damaged],
                          "unbound": list(deep.unbound), "audit": asdict(deep.audit)}))
    else:
        common.print_figures({**asdict(deep.audit), "sessions decoded": deep.sessions,
                              "damaged": len(deep.damaged), "unbound": len(deep.unbound)},
                             False, f"deep audit of {args.namespace}")
        for damaged in deep.damaged:
            print(f"damaged {damaged.session}: {damaged.error}: {damaged.message}")
        for name in deep.unbound:
            print(f"unbound {name}: written before schema 2 and on the legacy list; put or "
                  "append rewrites it")
    return 0 if deep.consistent else 1


def _cmd_dict_put(args: argparse.Namespace) -> int:
    store, model = _store(args)
    with open(args.dictionary, "rb") as stream:
        dictionary = Dictionary.from_bytes(stream.read())
    if dictionary.vocab_size != model.vocab_size:
        raise DictionaryMismatchError(
            f"{args.dictionary} is for a vocabulary of {dictionary.vocab_size:,} tokens, the "
            f"model has {model.vocab_size:,}: build it with this model (seqkv dict build)")
    stored = store.put_dictionary(dictionary, namespace=args.namespace)
    common.print_figures(asdict(stored), args.json,
                         f"dictionary {stored.digest[:16]}... is current in {args.namespace}")
    return 0


def _cmd_dict_ls(args: argparse.Namespace) -> int:
    store, _ = _store(args)
    current = store.current_dictionary(namespace=args.namespace)
    digests = [str(d) for d in store.dictionaries(namespace=args.namespace)]
    if args.json:
        print(json.dumps({"current": None if current is None else str(current.digest),
                          "dictionaries": digests}))
    else:
        print("\n".join(f"{d}{' (current)' if current and d == current.digest else ''}"
                        for d in digests))
    return 0


def _cmd_put_many(args: argparse.Namespace) -> int:
    store, model = _store(args)
    report = put_many_jsonl(store, args.sessions, level=args.level.spec.name,
                            tokenize=model.encode_text,
                            progress=common.reporter_of(args).sink)
    common.print_figures(asdict(report), args.json, f"stored the sessions of {args.sessions}")
    return 0


def _cmd_get_many(args: argparse.Namespace) -> int:
    store, model = _store(args)
    try:
        with atomic_output(args.output) as temporary:
            report = get_many_jsonl(store, args.sessions, temporary,
                                    detokenize=model.decode_tokens,
                                    progress=common.reporter_of(args).sink)
    except OSError as error:
        raise OutputError(f"cannot write {args.output}: {error.strerror or error}; no output "
                          "was changed") from None
    common.print_figures(asdict(report), args.json, f"restored the sessions of {args.sessions}")
    return 0


def add_store(commands: common.Subparsers) -> None:
    store = commands.add_parser("store", help="sessions in a shared store: put, get, append "
                                               "turns, list, statistics, garbage collection")
    verbs = store.add_subparsers(dest="store_verb", required=True)

    def common_options(command: argparse.ArgumentParser) -> None:
        command.add_argument("--store", default=DEFAULT_STORE, metavar="LOCATION",
                             type=location_argument,
                             help="dir:PATH or redis://HOST:PORT/DB (default "
                                  f"{DEFAULT_STORE})")
        command.add_argument("--namespace", default="default",
                             help="the tenant (default \"default\")")
        common.model_option(command)
        common.json_option(command)
        common.progress_option(command)

    def max_tokens_option(command: argparse.ArgumentParser) -> None:
        command.add_argument("--max-tokens", type=common.int_in(1, MAX_POSITIONS), default=None,
                             metavar="N",
                             help="refuse a session claiming more than N tokens before any "
                                  "forward (default: the model's context)")

    def level_option(command: argparse.ArgumentParser) -> None:
        command.add_argument("--level", type=common.level_argument,
                             default=common.level_argument(DEFAULT_STORE_LEVEL),
                             metavar="LEVEL",
                             help=f"coding level (default {DEFAULT_STORE_LEVEL}: decodes on any "
                                  "machine; portable+mix codes with the namespace's dictionary "
                                  "(dict-put))")

    put = verbs.add_parser("put", help="store a text (and its prefill KV) as a session")
    put.add_argument("session_id", metavar="SESSION_ID")
    put.add_argument("text", metavar="TEXT", type=common.input_file,
                     help="UTF-8 text file, or - for stdin")
    put.add_argument("--kv", choices=["prefill", "none"], default="prefill",
                     help="store the KV of one prefill over the text (default) or tokens only")
    level_option(put)
    common_options(put)
    put.set_defaults(run=_cmd_put)

    get = verbs.add_parser("get", help="restore a session's text (and KV)")
    get.add_argument("session_id", metavar="SESSION_ID")
    get.add_argument("-o", "--output", required=True, metavar="TEXT",
                     type=common.output_file_or_stdout, help="text file, or -")
    get.add_argument("--kv-out", metavar="KV.safetensors", type=common.output_file,
                     help="also write the KV cache")
    max_tokens_option(get)
    common_options(get)
    get.set_defaults(run=_cmd_get, paths=common.PathRoles((), ("output", "kv_out")))

    ls = verbs.add_parser("ls", help="list the sessions of a namespace")
    common_options(ls)
    ls.set_defaults(run=_cmd_ls)

    stat = verbs.add_parser("stat", help="a session's bytes and tokens (its row checked without "
                                          "a decode), or the namespace's")
    stat.add_argument("session_id", metavar="SESSION_ID", nargs="?")
    common_options(stat)
    stat.set_defaults(run=_cmd_stat)

    audit = verbs.add_parser("audit", help="recount the namespace's references; --deep also "
                                            "decodes every session and names damaged ones")
    audit.add_argument("--deep", action="store_true",
                       help="decode every session, check it against its row's binding, and "
                            "name the damaged and the unbound (schema 1, listed) ones")
    max_tokens_option(audit)
    common_options(audit)
    audit.set_defaults(run=_cmd_audit)

    gc = verbs.add_parser("gc", help="remove what no session needs any more")
    common_options(gc)
    gc.set_defaults(run=_cmd_gc)

    dict_put = verbs.add_parser("dict-put", help="store a mixing dictionary in the namespace "
                                                  "and make it current (for portable+mix)")
    dict_put.add_argument("dictionary", metavar="DICT", type=common.input_file_no_stdin,
                          help="a dictionary built for the namespace (seqkv dict build "
                               "--namespace NS)")
    common_options(dict_put)
    dict_put.set_defaults(run=_cmd_dict_put, paths=common.PathRoles(("dictionary",), ()))

    dict_ls = verbs.add_parser("dict-ls", help="the namespace's dictionaries and its current one")
    common_options(dict_ls)
    dict_ls.set_defaults(run=_cmd_dict_ls)

    put_many = verbs.add_parser("put-many", help="store every session of a JSON-lines file")
    put_many.add_argument("sessions", metavar="SESSIONS.jsonl", type=common.input_file_no_stdin)
    level_option(put_many)
    common_options(put_many)
    put_many.set_defaults(run=_cmd_put_many)

    get_many = verbs.add_parser("get-many", help="restore the sessions a JSON-lines file lists, "
                                                  "sharing forwards")
    get_many.add_argument("sessions", metavar="SESSIONS.jsonl", type=common.input_file_no_stdin)
    get_many.add_argument("-o", "--output", required=True, metavar="OUT.jsonl",
                          type=common.output_file)
    common_options(get_many)
    get_many.set_defaults(run=_cmd_get_many,
                          paths=common.PathRoles(("sessions",), ("output",)))
