#!/usr/bin/env python3
"""Tries to fool scripts/doc_examples.py: docs that differ from what a binary prints in ways
that must fail (a byte figure off by one digit, a block that cannot run and is not marked,
stderr or an exit code the block does not show), and ways that must pass (a masked planning
time that differs). Also --update: prose and other blocks untouched, the doc's planning time
kept on an unchanged line.

Usage: scripts/test_doc_examples.py SHARDPLAN_BINARY (ctest docs.examples_selftest)."""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "doc_examples.py"
BINARY = None  # the real shardplan, from the command line

FENCE = "```"


def doc(text):
    """Markdown from an indented literal, with ``` written as FENCE to keep this file readable."""
    return textwrap.dedent(text).lstrip("\n").replace("FENCE", FENCE)


class DocExamples(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="test_doc_examples.")
        self.root = Path(self.dir.name)

    def tearDown(self):
        self.dir.cleanup()

    def write(self, text, name="doc.md"):
        path = self.root / name
        path.write_text(doc(text), encoding="utf-8")
        return path

    def fake_binary(self, output):
        """An executable that prints OUTPUT whatever its arguments (a stand-in for shardplan
        whose figures the test chooses)."""
        (self.root / "fake_output.txt").write_text(output, encoding="utf-8")
        fake = self.root / "fake_shardplan"
        fake.write_text(f"#!{sys.executable}\nimport sys, pathlib\n"
                        "sys.stdout.write((pathlib.Path(__file__).parent / "
                        "'fake_output.txt').read_text())\n")
        fake.chmod(0o755)
        return fake

    def run_script(self, mode, path, binary=None):
        proc = subprocess.run([sys.executable, str(SCRIPT), mode, str(binary or BINARY),
                               str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=600)
        return proc.returncode, proc.stdout

    VISUALIZE = """
        Prose.

        FENCE
        $ shardplan visualize --shape 64 --mesh x:4,y:2 --spec x+y
        ┌────────────┬────────────┬────────────┬────────────┬────────────┬────────────┬────────────┬────────────┐
        │            │            │            │            │            │            │            │            │
        │  device 0  │  device 1  │  device 2  │  device 3  │  device 4  │  device 5  │  device 6  │  device 7  │
        │            │            │            │            │            │            │            │            │
        └────────────┴────────────┴────────────┴────────────┴────────────┴────────────┴────────────┴────────────┘
        each device holds a [8] block of f32: 32 B (256 B in all)
        FENCE
        """

    def test_the_block_as_printed_passes(self):
        rc, out = self.run_script("--check", self.write(self.VISUALIZE))
        self.assertEqual(rc, 0, out)
        self.assertIn("1 passed, 0 failed", out)

    def test_a_byte_figure_one_digit_off_fails(self):
        path = self.write(self.VISUALIZE.replace("(256 B in all)", "(257 B in all)"))
        rc, out = self.run_script("--check", path)
        self.assertEqual(rc, 1, out)
        self.assertIn("doc.md:4: the output differs from the doc", out)
        self.assertIn("-each device holds a [8] block of f32: 32 B (257 B in all)", out)
        self.assertIn("+each device holds a [8] block of f32: 32 B (256 B in all)", out)
        self.assertIn("@@ -7,4 +7,4 @@", out)  # the hunk names the doc's lines (7-10)

    def test_an_unmarked_block_that_cannot_run_fails(self):
        text = """
            FENCE
            $ shardplan checkpoint inspect llama-3-70b-checkpoint
            model.embed_tokens.weight  BF16  [128256, 8192]  2.00 GiB  model-00001-of-00030.safetensors
            FENCE
            """
        rc, out = self.run_script("--check", self.write(text))
        self.assertEqual(rc, 1, out)
        self.assertIn("doc.md:2: the command printed on stderr", out)
        self.assertIn("no such file or directory 'llama-3-70b-checkpoint'", out)
        self.assertIn("+[exit 2]", out)  # a missing input is bad usage (docs/cli.md)
        marked = self.write("<!-- example: not run (a checkpoint of 140 GB) -->\n" +
                            doc(text), name="marked.md")
        rc, out = self.run_script("--check", marked)
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"not run  \S*marked\.md:3  shardplan checkpoint inspect")
        self.assertIn("(a checkpoint of 140 GB)", out)

    def test_a_masked_planning_time_that_differs_passes_and_nothing_else_is_masked(self):
        printed = ("  peak                                         2.67 GiB\n"
                   "FLOPs per step, all devices: 2.89e+17; planned in 0.41 s, extrapolated\n")
        fake = self.fake_binary(printed)
        shown = """
            FENCE
            $ shardplan train-plan -c Meta-Llama-3-70B
              peak                                         2.67 GiB
            FLOPs per step, all devices: 2.89e+17; planned in 12.5 s, extrapolated
            FENCE
            """
        rc, out = self.run_script("--check", self.write(shown), fake)
        self.assertEqual(rc, 0, out)
        for before, after in [("2.89e+17", "2.88e+17"), ("2.67 GiB", "2.68 GiB"),
                              ("extrapolated", "traced whole")]:
            rc, out = self.run_script("--check", self.write(shown.replace(before, after)), fake)
            self.assertEqual(rc, 1, f"{before} -> {after}: {out}")
            self.assertIn(after, out)
        # The mask takes the number only: "planned in" with another unit is compared.
        rc, out = self.run_script("--check", self.write(shown.replace("12.5 s", "12.5 ms")), fake)
        self.assertEqual(rc, 1, out)

    def test_stderr_and_an_exit_code_are_compared_when_shown_and_required_when_printed(self):
        message = ("shardplan: [plan] dim 0 of a tensor (shape [6]) is not divisible by mesh axis "
                   "'x' (size 4); 6 is not a multiple of 4")
        shown = f"""
            FENCE
            $ shardplan visualize --shape 6 --mesh x:4 --spec x 2>&1
            {message}
            [exit 1]
            FENCE
            """
        rc, out = self.run_script("--check", self.write(shown))
        self.assertEqual(rc, 0, out)
        rc, out = self.run_script("--check", self.write(shown.replace("[exit 1]", "[exit 2]")))
        self.assertEqual(rc, 1, out)
        rc, out = self.run_script("--check", self.write(shown.replace("            [exit 1]\n", "")))
        self.assertEqual(rc, 1, out)
        self.assertIn("+[exit 1]", out)
        rc, out = self.run_script("--check", self.write(shown.replace(" 2>&1", "").replace(
            f"            {message}\n", "")))
        self.assertEqual(rc, 1, out)
        self.assertIn("printed on stderr, which the block does not show", out)

    def test_arguments_are_split_as_a_shell_splits_them(self):
        shown = """
            FENCE
            $ shardplan plan \\
                --html '' 2>&1
            --html: the path is empty
            Run with --help for more information.
            [exit 2]
            FENCE
            """
        rc, out = self.run_script("--check", self.write(shown))
        self.assertEqual(rc, 0, out)
        self.assertIn("shardplan plan --html '' 2>&1", out)

    def test_update_rewrites_only_the_output_and_keeps_the_doc_planning_time(self):
        fake = self.fake_binary("peak 3.00 GiB\nplanned in 9.87 s\nnew line\n")
        before = """
            # Title

            - A list item with an example:

              FENCE
              $ shardplan train-plan -c Meta-Llama-3-70B \\
                  --batch 8
              peak 2.00 GiB
              planned in 0.50 s
              FENCE

            FENCE
            shardplan plan [--model M]
            not an example: left alone
            FENCE
            """
        path = self.write(before)
        rc, out = self.run_script("--update", path, fake)
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"updated  \S*doc\.md:6\n")
        after = before.replace("peak 2.00 GiB", "peak 3.00 GiB").replace(
            "planned in 0.50 s\n", "planned in 0.50 s\n              new line\n")
        self.assertEqual(path.read_text(encoding="utf-8"), doc(after))
        rc, out = self.run_script("--check", path, fake)
        self.assertEqual(rc, 0, out)

    def test_what_would_not_be_run_is_an_error(self):
        cases = {
            "a marker without a reason": "<!-- example: not run () -->\nFENCE\n$ shardplan presets\nFENCE\n",
            "a marker before another block": "<!-- example: not run (why) -->\nFENCE\nshardplan presets\nFENCE\n",
            "a marker with a blank line after it": "<!-- example: not run (why) -->\n\nFENCE\n$ shardplan presets\nFENCE\n",
            "a command after the first line": "FENCE\n# presets\n$ shardplan presets\nFENCE\n",
            "a pipe": "FENCE\n$ shardplan presets | head -1\nFENCE\n",
            "a redirection": "FENCE\n$ shardplan presets > presets.txt\nFENCE\n",
            "an unclosed block": "FENCE\n$ shardplan presets\n",
        }
        for name, text in cases.items():
            rc, out = self.run_script("--check", self.write(text))
            self.assertEqual(rc, 1, f"{name}: {out}")
            self.assertRegex(out, r"doc_examples: .*doc\.md:\d+: ", name)


if __name__ == "__main__":
    if len(sys.argv) < 2 or not os.access(sys.argv[1], os.X_OK):
        sys.exit("usage: test_doc_examples.py SHARDPLAN_BINARY")
    BINARY = Path(sys.argv.pop(1)).resolve()
    unittest.main(verbosity=2)
