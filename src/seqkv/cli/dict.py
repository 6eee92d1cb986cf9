"""``seqkv dict``: mixing dictionaries, built from sample texts, used by ``portable+mix``.

``seqkv dict build TEXT... -o DICT`` tokenizes the texts with the model and builds a
content-addressed dictionary (``seqkv.mixing.build_dictionary``); ``seqkv compress --dict DICT``
codes against it at ``portable+mix``, and ``seqkv decompress --dict DICT`` decodes such a file
(a missing or different dictionary is refused by name).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from seqkv.cli import common
from seqkv.mixing.dictionary import Dictionary, build_dictionary


class DictionaryFile:
    """One dictionary read from a file, as a ``seqkv.codec.DictionarySource``."""

    def __init__(self, path: str) -> None:
        self.dictionary = Dictionary.from_bytes(Path(path).read_bytes())

    def get(self, digest: str) -> Dictionary | None:
        return self.dictionary if str(self.dictionary.digest) == digest else None


def _cmd_build(args: argparse.Namespace) -> int:
    model = common.load_for(args)
    sequences = [model.encode_text(common.read_text(path)) for path in args.texts]
    dictionary = build_dictionary(sequences, model.vocab_size, namespace=args.namespace)
    common.write_outputs([(args.output, dictionary.to_bytes())])
    common.print_figures({"dictionary": str(args.output), "digest": str(dictionary.digest),
                          "texts": len(sequences), "tokens": len(dictionary),
                          "bytes": dictionary.size_bytes}, args.json,
                         f"dictionary written to {args.output}")
    return 0


def add_dict(commands: common.Subparsers) -> None:
    group = commands.add_parser("dict", help="mixing dictionaries for the portable+mix level")
    verbs = group.add_subparsers(dest="dict_verb", required=True)
    build = verbs.add_parser("build", help="build a dictionary from sample texts")
    build.add_argument("texts", metavar="TEXT", nargs="+", type=common.input_file_no_stdin,
                       help="UTF-8 text files")
    build.add_argument("-o", "--output", required=True, metavar="DICT", type=common.output_file)
    build.add_argument("--namespace", default="", help="the tenant the dictionary belongs to "
                                                       "(part of its digest)")
    common.model_option(build)
    common.json_option(build)
    build.set_defaults(run=_cmd_build, paths=common.PathRoles(("texts",), ("output",)))
