#!/usr/bin/python3
"""Parses a Prometheus text exposition with the reference client's parser
(Debian's python3-prometheus-client) and prints one line per sample:
NAME{label="value",...} VALUE with the labels sorted and their values
escaped again as the format escapes them (backslash, double quote, newline). Exit 1, with the
parser's words, when the text does not parse."""
import sys

from prometheus_client.parser import text_string_to_metric_families


def escape(v):
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


try:
    text = open(sys.argv[1], encoding="utf-8").read()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{escape(v)}"' for k, v in sorted(s.labels.items()))
            print(f"{s.name}{{{labels}}} {s.value!r}")
except Exception as e:  # the parser raises ValueError and others on bad input
    print(f"does not parse: {e}", file=sys.stderr)
    sys.exit(1)
