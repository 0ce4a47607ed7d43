"""``sparkstate generate``: the generator's records into files or onto a socket (:mod:`sparkstate.jobs.generate`)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from ._terminal import positive_int


def add_parser(sub: Any) -> None:
    """The ``generate`` subcommand."""
    gen = sub.add_parser(
        "generate",
        help="write a synthetic clickstream to files, or serve it on a socket",
        description=(
            "The built-in generator's clickstream (user_id, event_time, data, is_last) as JSON lines:"
            " into --out DIR (several files, in order), or served on localhost --socket PORT until Ctrl-C."
            " The same seed gives the same records."
        ),
    )
    where = gen.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", metavar="DIR", help="write files into DIR")
    where.add_argument("--socket", type=int, metavar="PORT", help="serve on HOST:PORT (0: a free port)")
    gen.add_argument("--host", default="127.0.0.1", help="interface to serve on (default: %(default)s)")
    gen.add_argument("--events", type=positive_int, help="number of records (default: 1000 for files,"
                     " endless for a socket)")
    gen.add_argument("--users", type=positive_int, default=50, help="number of users (default: %(default)s)")
    gen.add_argument("--seed", type=int, default=0, help="generator seed (default: %(default)s)")
    gen.add_argument("--files", type=positive_int, default=10, help="files to write (default: %(default)s)")
    gen.add_argument("--rate", type=float, default=100.0, help="socket: records per second (default: %(default)s)")
    gen.add_argument("--gap", default="1 minute", help="session gap the data is shaped for (default: %(default)s)")
    gen.add_argument("--last", type=float, default=0.3, help="share of sessions ending with is_last (default: %(default)s)")
    gen.add_argument("--late", type=float, default=0.0, help="share of late records (default: %(default)s)")
    gen.add_argument("--malformed", type=float, default=0.0, help="share of malformed records (default: %(default)s)")
    gen.set_defaults(run=_generate)


def _generate(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..synthetic import StreamConfig
    from ..jobs.generate import generate_files, serve_generated

    console = Console(highlight=False)
    common = dict(users=args.users, seed=args.seed, gap=args.gap, last_share=args.last,
                  late_share=args.late, malformed_share=args.malformed)
    if args.out is not None:
        config = StreamConfig(events=args.events or 1000, rate=0, **common)
        written = generate_files(args.out, config, files=args.files)
        kinds = ", ".join(f"{n} {k}" for k, n in written.kinds.items())
        console.print(f"Wrote {written.records} records ({kinds}) into {len(written.paths)} files in"
                      f" {Path(written.directory).resolve()}")
        return 0
    config = StreamConfig(events=args.events, rate=args.rate, **common)
    server = serve_generated(config, port=args.socket, host=args.host)
    total = "endless" if args.events is None else f"{args.events} records"
    console.print(f"Serving the generator ({total}, {args.rate:g}/s) on {server.host}:{server.port};"
                  f" read it with --source socket:{server.host}:{server.port}. Ctrl-C stops.")
    try:
        while True:
            time.sleep(0.5)
    except KeyboardInterrupt:
        console.print(f"Stopped after {server.lines_sent} lines to {server.connections} client(s).")
        return 0
    finally:
        server.close()
