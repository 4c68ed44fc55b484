"""``python -m bench NAME [options]``: run one benchmark (``--help`` lists them)."""

from __future__ import annotations

import argparse
import sys

from bench import (
    ab,
    app,
    bound,
    cold,
    delivery,
    delivery_ab,
    fanout,
    feed,
    generate,
    http,
    idle,
    machine,
    supervisors,
)

BENCHMARKS = {
    "ab": ab,
    "app": app,
    "bound": bound,
    "cold": cold,
    "delivery": delivery,
    "delivery-ab": delivery_ab,
    "fanout": fanout,
    "feed": feed,
    "generate": generate,
    "http": http,
    "idle": idle,
    "machine": machine,
    "supervisors": supervisors,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = parser.add_subparsers(dest="name", required=True)
    for name, module in BENCHMARKS.items():
        module.add_arguments(sub.add_parser(name, help=(module.__doc__ or name).splitlines()[0]))
    args = parser.parse_args(argv)
    return int(BENCHMARKS[args.name].run(args))


if __name__ == "__main__":
    sys.exit(main())
