"""Turns report.json (written by a full conformance run) into the markdown
report of docs/conformance-report.md and, on request, into a new
expected_failures.json.

    python tests/conformance/make_report.py            # rewrite docs/conformance-report.md
    python tests/conformance/make_report.py --expected # also rewrite the list

``--expected`` lists every test of the report that did not pass: failures
as ``xfail`` and tests with nothing to compare as ``skip``. Reasons already
written in the list are kept (they are the triage); new entries get the
first error line as a placeholder reason, to be replaced by a triaged one.
Entries whose test now passes are dropped.
"""

import argparse
import json
import os
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
REPORT = os.path.join(HERE, "report.json")
EXPECTED = os.path.join(HERE, "expected_failures.json")
DOC = os.path.join(ROOT, "docs", "conformance-report.md")
BEGIN = "<!-- BEGIN GENERATED REPORT (tests/conformance/make_report.py) -->"
END = "<!-- END GENERATED REPORT -->"

DTYPE_ORDER = ["float32", "float64", "float16", "bfloat16", "complex64", "int64", "bool",
               "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"]


def _md(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(report):
    s = report["summary"]
    lines = [
        f"Generated from `tests/conformance/report.json` (torch {report['torch']}).",
        "",
        f"- tests: **{s['tests']}** over **{s['ops']}** ops/framework tests: "
        f"{s['passed']} passed, {s['failed']} failed "
        f"({s['expected_failures']} listed, {s['unexpected_failures']} unexpected, "
        f"{s['unexpected_passes']} unexpected passes), {s['skipped']} skipped",
        f"- samples matching the CPU: **{s['samples_matched']} of {s['samples']} "
        f"({s['samples_matched_pct']}%)**",
        "",
        "| op | dtypes tested | samples (match/total) | passed | failed | skipped | reason |",
        "|---|---|---|---|---|---|---|",
    ]
    for op in report["ops"]:
        reasons = []
        for t in op["tests"]:
            if t["status"] != "passed":
                r = t["reason"] or t.get("error", "")
                tag = f"{t['check']}"
                if r and (tag, r) not in reasons:
                    reasons.append((tag, r))
        merged = defaultdict(list)
        for tag, r in reasons:
            merged[r].append(tag)
        reason = "; ".join(f"{'/'.join(sorted(set(tags)))}: {r}" for r, tags in merged.items())
        dtypes = sorted(op["dtypes"], key=lambda d: DTYPE_ORDER.index(d) if d in DTYPE_ORDER else 99)
        lines.append(
            f"| `{_md(op['op'])}` | {', '.join(dtypes) or '-'} | "
            f"{op['matched']}/{op['samples']} | {op['passed']} | {op['failed']} | "
            f"{op['skipped']} | {_md(reason)[:400]} |"
        )
    return "\n".join(lines)


def update_doc(report):
    with open(DOC) as f:
        text = f.read()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    text = text[:start] + "\n" + table(report) + "\n" + text[end:]
    with open(DOC, "w") as f:
        f.write(text)


def update_expected(report):
    old = []
    if os.path.exists(EXPECTED):
        with open(EXPECTED) as f:
            old = json.load(f).get("entries", [])
    old_reason = {}
    not_strict = set()  # xfail entries whose outcome depends on the machine
    for e in old:
        for d in e.get("dtypes") or ["*"]:
            old_reason[(e["check"], e["op"], d)] = e["reason"]
            if not e.get("strict", True):
                not_strict.add((e["check"], e["op"], d))

    def reason_for(check, op, dtype, fallback):
        for k in ((check, op, dtype), (check, op, "*"), ("*", op, dtype), ("*", op, "*")):
            if k in old_reason:
                return old_reason[k]
        return fallback

    groups = defaultdict(list)  # (check, op, kind, reason, strict) -> dtypes
    for op in report["ops"]:
        for t in op["tests"]:
            strict = not any(k in not_strict for k in (
                (t["check"], op["op"], t["dtype"]), (t["check"], op["op"], "*")))
            if t["status"] in ("passed", "xpassed") and strict:
                continue
            if t["check"] == "framework":
                continue
            if t["status"] in ("skipped", "unlisted-skip"):
                kind = "skip"
            else:
                kind = "xfail"
            reason = reason_for(t["check"], op["op"], t["dtype"], t.get("error") or t["reason"])
            groups[(t["check"], op["op"], kind, reason, strict)].append(t["dtype"])
    entries = []
    for (check, op, kind, reason, strict), dtypes in sorted(groups.items()):
        entry = {
            "op": op,
            "check": check,
            "dtypes": sorted(dtypes, key=lambda d: DTYPE_ORDER.index(d) if d in DTYPE_ORDER else 99),
            "kind": kind,
            "reason": reason,
        }
        if not strict:
            entry["strict"] = False
        entries.append(entry)
    with open(EXPECTED, "w") as f:
        json.dump({
            "about": "Every conformance test that may fail (xfail: must fail, a pass is an "
                     "error) or is not run (skip), with its reason. See docs/conformance.md.",
            "entries": entries,
        }, f, indent=1)
        f.write("\n")
    print(f"{EXPECTED}: {len(entries)} entries")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", default=REPORT)
    parser.add_argument("--expected", action="store_true", help="rewrite expected_failures.json")
    args = parser.parse_args()
    with open(args.report) as f:
        report = json.load(f)
    if args.expected:
        update_expected(report)
    update_doc(report)
    print(f"{DOC}: table of {len(report['ops'])} rows")


if __name__ == "__main__":
    main()
