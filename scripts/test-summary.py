#!/usr/bin/env python3
"""Summarises a `cargo test -- --show-output` log for scripts/test.sh.

usage: test-summary.py LOG BINARIES_JSON ALLOWED_SKIPS CARGO_STATUS

Prints one line per test binary (passed, failed, ignored, skipped) and
every skip, then exits 1 when a test failed, a binary did not finish, a
test skipped without being listed in ALLOWED_SKIPS, or cargo failed.

A test is named `PACKAGE/TARGET::TEST` (e.g.
`mapfs-cli/exclusive::exclusive_keeps_positive_entries`, or
`mapfs/doc::...` for doc tests), prefixed `uring:` in the pass that
scripts/test.sh runs on FUSE over io_uring. A skip is a line of a test's own output
that contains the word SKIPPED; libtest shows that output only with
--show-output, under a `---- TEST stdout ----` header. A line starting
with SKIPPED elsewhere in a binary's output (printed by a program a test
ran, whose stderr libtest does not capture) counts as a skip of
`PACKAGE/TARGET::?`.

ALLOWED_SKIPS: one entry a line, `PATTERN REASON`, PATTERN a shell glob
matched against the name above; `#` starts a comment. A reason is
required, so that every accepted skip says why.
"""

import fnmatch
import json
import os
import re
import sys

RUNNING = re.compile(r"^\s*Running (.+?) \((.+)\)\s*$")
DOCTESTS = re.compile(r"^\s*Doc-tests (\S+)\s*$")
RESULT = re.compile(
    r"^test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored;"
)
HEADER = re.compile(r"^---- (.+) stdout ----$")
SKIP = re.compile(r"\bSKIPPED\b")
PASS = re.compile(r"^test\.sh: pass transport=(\S+)$")
OUTSIDE_SKIP = re.compile(r"^\s*(?:!+\s*)?SKIPPED\b")


def package_name(package_id):
    # "path+file:///x/crates/mapfs-cli#0.1.0" or "...#name@0.1.0"
    frag = package_id.rsplit("#", 1)[-1]
    if "@" in frag:
        return frag.split("@", 1)[0]
    return os.path.basename(package_id.rsplit("#", 1)[0])


def binaries(path):
    """Test executable (without directory) -> PACKAGE/TARGET."""
    names = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            exe = msg.get("executable")
            if msg.get("reason") != "compiler-artifact" or not exe:
                continue
            names[os.path.basename(exe)] = "%s/%s" % (
                package_name(msg["package_id"]),
                msg["target"]["name"],
            )
    return names


def allowed_skips(path):
    entries = []
    if not os.path.exists(path):
        return entries
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split(None, 1)
            if len(parts) < 2:
                sys.exit("%s:%d: `%s` has no reason" % (path, n, parts[0]))
            entries.append((parts[0], parts[1]))
    return entries


def main():
    log, bins_json, allowed_path, cargo_status = sys.argv[1:5]
    bins = binaries(bins_json)
    allowed = allowed_skips(allowed_path)
    runs = []  # [name, result or None, passed, failed, ignored, skips]
    cur, test = None, None
    prefix = ""  # "uring:" in the second pass (scripts/test.sh)
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = PASS.match(line)
            if m:
                prefix = m.group(1) + ":"
                cur, test = None, None
                continue
            m = RUNNING.match(line)
            if m:
                exe = os.path.basename(m.group(2))
                cur = [prefix + bins.get(exe, "%s (%s)" % (m.group(1), exe)),
                       None, 0, 0, 0, []]
                runs.append(cur)
                test = None
                continue
            m = DOCTESTS.match(line)
            if m:
                cur = [m.group(1) + "/doc", None, 0, 0, 0, []]
                runs.append(cur)
                test = None
                continue
            if cur is None:
                continue
            m = HEADER.match(line)
            if m:
                test = m.group(1)
                continue
            if line in ("successes:", "failures:"):
                test = None
                continue
            m = RESULT.match(line)
            if m:
                cur[1] = m.group(1)
                cur[2:5] = [int(m.group(i)) for i in (2, 3, 4)]
                test = None
                continue
            if test is not None and SKIP.search(line):
                full = "%s::%s" % (cur[0], test)
                if not any(full == s[0] for s in cur[5]):
                    cur[5].append((full, line.strip()))
            elif test is None and OUTSIDE_SKIP.match(line):
                # Printed by a process a test ran (its stderr is not
                # captured): the binary is known, the test is not.
                full = "%s::?" % cur[0]
                if not any(full == s[0] and line.strip() == s[1] for s in cur[5]):
                    cur[5].append((full, line.strip()))

    bad = int(cargo_status) != 0
    width = max([len(r[0]) for r in runs] + [10])
    print()
    print("%-*s %7s %7s %7s %7s" % (width, "binary", "passed", "failed",
                                    "ignored", "skipped"))
    totals = [0, 0, 0, 0]
    for name, result, passed, failed, ignored, skips in runs:
        status = "" if result == "ok" else (
            "  <- FAILED" if result else "  <- DID NOT FINISH")
        if result != "ok":
            bad = True
        print("%-*s %7d %7d %7d %7d%s" % (width, name, passed, failed,
                                          ignored, len(skips), status))
        for i, v in enumerate((passed, failed, ignored, len(skips))):
            totals[i] += v
    print("%-*s %7d %7d %7d %7d" % (width, "total (%d binaries)" % len(runs),
                                    *totals))
    unlisted = []
    for run in runs:
        for full, text in run[5]:
            reason = next((r for p, r in allowed if fnmatch.fnmatchcase(full, p)),
                          None)
            if reason is None:
                unlisted.append((full, text))
            else:
                print("allowed skip: %s (%s)" % (full, reason))
    for full, text in unlisted:
        print("UNLISTED SKIP: %s: %s" % (full, text))
    if unlisted:
        print("test.sh: %d test(s) skipped without an entry in %s; install "
              "what they need (scripts/deps.sh) or list them with a reason"
              % (len(unlisted), allowed_path))
        bad = True
    if not runs:
        print("test.sh: no test binary ran")
        bad = True
    if int(cargo_status) != 0:
        print("test.sh: cargo test exited with status %s" % cargo_status)
    print("test.sh: %s" % ("FAILED" if bad else "ok"))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
