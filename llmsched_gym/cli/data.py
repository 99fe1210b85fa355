"""``llmsched data list | download NAME|all | path NAME``: the real traces and GPU profiles the
simulator can use (the catalogue, the cache and the download are :mod:`llmsched_gym.data`'s)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from llmsched_gym import data
from llmsched_gym.data import DATASETS, DataError, data_dir, download, get_dataset, locate, sha256_of


def _cmd_list(args: argparse.Namespace) -> int:
    print(f"cache: {data_dir()}  (set LLMSCHED_DATA to move it)")
    for ds in DATASETS.values():
        found = locate(ds)
        where = "not present"
        if found:
            checked = "" if sha256_of(found[0]) == ds.sha256 else ", NOT the published file: sha256 differs"
            where = f"present ({found[1]}: {found[0]}{checked})"
        print(f"\n{ds.name}  {ds.size:,} bytes  {where}")
        print(f"  {ds.description}")
        print(f"  licence: {ds.licence}; cite: {ds.citation}")
        print(f"  sha256: {ds.sha256}")
        if ds.derive:
            print(f"  source: built from {ds.url} (sha256 {ds.source_sha256})")
        else:
            print(f"  source: {ds.url or 'no public file: ' + ds.howto}")
    return 0


def _cmd_download(args: argparse.Namespace) -> int:
    names = list(DATASETS) if args.name == "all" else [get_dataset(args.name).name]
    if args.url and len(names) > 1:
        raise DataError("--url: give one NAME with it, not 'all'")
    for name in names:
        if DATASETS[name].url is None and args.url is None and args.name == "all":
            print(f"{name}: skipped: {DATASETS[name].howto}", file=sys.stderr)
            continue
        download(name, url=args.url, progress=print)
    return 0


def _cmd_path(args: argparse.Namespace) -> int:
    ds = get_dataset(args.name)
    found = locate(ds)
    if found is None:
        print(f"{ds.name}: not present (it would go to {data_dir() / ds.relpath}); "
              f"`llmsched data download {ds.name}`", file=sys.stderr)
        return 1
    print(found[0])
    return 0


def add_subcommands(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """Add ``llmsched data list | download NAME|all | path NAME`` to the ``llmsched`` parser's
    subcommands."""
    sp = sub.add_parser("data", help="real traces and GPU profiles: list, download, locate",
                        description=data.__doc__.split("\n\n")[1], formatter_class=fmt)
    dsub = sp.add_subparsers(dest="data_command", required=True)
    p = dsub.add_parser("list", help="known files, their source, licence, sha256 and local copy", formatter_class=fmt)
    p.set_defaults(func=_cmd_list)
    p = dsub.add_parser("download", help="fetch into the cache, sha256-verified, resumable", formatter_class=fmt)
    p.add_argument("name", metavar="NAME", help=f"a known name ({', '.join(DATASETS)}) or 'all'")
    p.add_argument("--url", default=None,
                   help="fetch from this URL (a mirror or file:///...) instead of the publisher's")
    p.set_defaults(func=_cmd_download)
    p = dsub.add_parser("path", help="print where NAME is read from (exit 1 if it is nowhere)", formatter_class=fmt)
    p.add_argument("name", metavar="NAME", help="a known name")
    p.set_defaults(func=_cmd_path)
