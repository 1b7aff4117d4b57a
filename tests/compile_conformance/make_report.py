"""Turns report.json (written by a complete run of the compile conformance
suite) into the results block of docs/conformance-report.md.

    python tests/compile_conformance/make_report.py [--report PATH]

The block gives the share of the ops the CPU compiles correctly that
phantom compiles correctly too, every exception listed in
expected_failures.json with its reason, and the ops that are not counted
(the CPU does not compile them correctly, or the sample raises eagerly),
grouped by the CPU's error.
"""

import argparse
import json
import os
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DOC = os.path.join(ROOT, "docs", "conformance-report.md")
BEGIN = "<!-- BEGIN COMPILE CONFORMANCE RESULTS -->"
END = "<!-- END COMPILE CONFORMANCE RESULTS -->"


def _md(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def block(report):
    s = report["summary"]
    counts = s["counts"]
    scope = "every OpInfo" if report["full"] else "the default sample"
    lines = [
        f"Generated from `tests/compile_conformance/report.json` (torch {report['torch']}, "
        f"{scope}: {s['ops']} ops).",
        "",
        f"- the CPU compiles and gets right **{s['cpu_compiles_and_matches']}** ops; "
        f"phantom compiles and gets right **{s['phantom_compiles_and_matches']}** of them "
        f"(**{s['phantom_pct']}%**, target {s['target_pct']}%)",
        f"- statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
        "",
    ]
    listed = [t for t in report["ops"] if t["status"] in ("xfailed", "failed", "xpassed")]
    if listed:
        lines += ["| op | status | reason |", "|---|---|---|"]
        for t in listed:
            lines.append(f"| `{t['op']}` | {t['status']} | {_md(t['reason'])} |")
    else:
        lines.append("No exception: every op the CPU compiles correctly, phantom "
                     "compiles correctly (`expected_failures.json` is empty).")
    groups = defaultdict(list)
    for t in report["ops"]:
        if t["status"] in ("cpu-fails", "not-applicable"):
            reason = t["reason"].split(" (")[0]
            groups[(t["status"], reason)].append(t["op"])
    if groups:
        lines += ["", "Not counted (what the CPU does with them):", "",
                  "| why | ops |", "|---|---|"]
        for (status, reason), ops in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            why = ("the CPU's compiled run: " if status == "cpu-fails" else "") + reason
            lines.append(f"| {_md(why)} | {', '.join(f'`{op}`' for op in sorted(ops))} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", default=os.path.join(HERE, "report.json"))
    args = parser.parse_args()
    with open(args.report) as f:
        report = json.load(f)
    if not report.get("complete"):
        raise SystemExit(f"{args.report} is from a partial run; run the whole suite first")
    with open(DOC) as f:
        doc = f.read()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    doc = doc[:start] + "\n" + block(report) + "\n" + doc[end:]
    with open(DOC, "w") as f:
        f.write(doc)
    print(f"wrote the results block of {DOC}")


if __name__ == "__main__":
    main()
