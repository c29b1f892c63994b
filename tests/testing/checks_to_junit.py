"""Writes a JUnit file from a script's check results, one test case per check:

    python3 tests/testing/checks_to_junit.py RESULTS OUT SUITE CLASSNAME

RESULTS has a line per check, NAME<TAB>pass|fail<TAB>MESSAGE. Scripts whose
checks run outside Bazel (deploy/docker/build.sh,
tests/tools/torch_configure_checks.sh) use it so that .ci/run counts them.
"""
import sys
from xml.sax.saxutils import escape, quoteattr


def main(results, out_path, suite, classname):
    rows = [line.rstrip("\n").split("\t", 2) for line in open(results) if line.strip()]
    failed = sum(1 for _, result, _ in rows if result == "fail")
    with open(out_path, "w") as out:
        out.write('<?xml version="1.0" encoding="UTF-8"?>\n')
        out.write(f'<testsuites><testsuite name={quoteattr(suite)} tests="{len(rows)}" '
                  f'failures="{failed}">\n')
        for name, result, message in rows:
            out.write(f'  <testcase classname={quoteattr(classname)} name={quoteattr(name)}>')
            if result == "fail":
                out.write(f'<failure message={quoteattr(message)}>{escape(message)}</failure>')
            out.write("</testcase>\n")
        out.write("</testsuite></testsuites>\n")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit("usage: checks_to_junit.py RESULTS OUT SUITE CLASSNAME")
    main(*sys.argv[1:])
