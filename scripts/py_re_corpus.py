#!/usr/bin/env python3
"""The differential corpus for tests/python_re_test.cpp: Python's own `re` decides, shardplan's
pattern engine must agree.

Writes JSON lines (strings as hex of their UTF-8 bytes; paths with invalid UTF-8 are decoded with
'surrogateescape', as shardplan does):
  {"k": "m", "p": [pattern, ...], "s": path, "r": first index found by re.search, or -1}
  {"k": "e", "p": pattern, "pos": re.error.pos or null, "msg": message}   (Python rejects it)

Deterministic for a seed: python3 scripts/py_re_corpus.py OUT [--seed N] [--patterns N]
Only the standard library is used.
"""
import argparse
import json
import random
import re
import warnings

warnings.simplefilter("ignore")  # FutureWarning on "[[" and "--" in sets

# Characters paths and literals are made of: ASCII, Greek, CJK, an astral emoji, a combining
# mark, digits that are \d (Arabic-Indic) or only \w (superscript two), spaces that are \s only
# in Unicode (no-break space, line separator), newlines and tabs.
LITERALS = list("abcxyz019_/.- ") + ["é", "ß", "Ω", "λ", "中", "文", "😀", "\u0301", "٣", "²",
                                     "\u00a0", "\u2028", "\n", "\t", "K"]
SEGMENTS = ["model", "layers", "0", "17", "mlp", "up_proj", "weight", "bias", "self_attn",
            "q_proj", "embed", "norm", "ab", "a b", "x.y", "", "ζωή", "层", "权重", "😀😀",
            "e\u0301", "٣٤", "x²", "a\u00a0b", "l\u2028m", "w\n", "\n", "tab\there", "Ωmega",
            "straße", "_", "x_1", "K"]

CLASSES = ["[a-z]", "[^/]", "[α-ω]", "[\\w-]", "[^\\W\\d]", "[\\s\\S]", "[\\u4e00-\\u9fff]",
           "[😀-🙏]", "[\\x41-\\x5a]", "[]a]", "[a-]", "[\\]]", "[^a-z/]", "[0-9]", "[\\d.]",
           "[^\\n]", "[é\u0301]", "[\\t\\n ]", "[^\\s]", "[_\\W]", "[\\U0001F600-\\U0001F64F]",
           "[\\0-\\x1f]", "[\\b]", "[-a]", "[^-]"]
ESCAPES = ["\\w", "\\W", "\\d", "\\D", "\\s", "\\S", "\\.", "\\/", "\\-", "\\$", "\\n", "\\t",
           "\\x2f", "\\u00e9", "\\U0001F600", "\\0", "\\101", "\\\\", "\\(", "\\ "]
ANCHORS = ["^", "$", "\\A", "\\Z", "\\b", "\\B"]


class Gen:
    def __init__(self, rng, backtrack):
        self.rng = rng
        self.backtrack = backtrack  # allow lookaround, backreferences, atomic, possessive
        self.groups = 0
        self.names = []

    def atom(self, depth):
        r = self.rng.random()
        if r < 0.30:
            return self.rng.choice(LITERALS).replace("\\", "\\\\") if self.rng.random() < 0.9 \
                else re.escape(self.rng.choice(LITERALS))
        if r < 0.40:
            return "."
        if r < 0.52:
            return self.rng.choice(CLASSES)
        if r < 0.62:
            return self.rng.choice(ESCAPES)
        if r < 0.70:
            return self.rng.choice(ANCHORS)
        if r < 0.75:
            return self.rng.choice(SEGMENTS).replace("\\", "")  # a word, literally
        if depth > 2:
            return self.rng.choice(LITERALS)
        inner = self.alt(depth + 1)
        kinds = ["(", "(?:", "(?P<", "(?s:", "(?m:", "(?a:", "(?-s:", "(?x:"]
        if self.backtrack:
            kinds += ["(?=", "(?!", "(?>", "(?<=", "(?<!", "ref", "cond"]
        k = self.rng.choice(kinds)
        if k == "(":
            self.groups += 1
            return "(" + inner + ")"
        if k == "(?P<":
            self.groups += 1
            name = "g%d" % self.groups
            self.names.append(name)
            return "(?P<%s>%s)" % (name, inner)
        if k in ("(?<=", "(?<!"):
            fixed = "".join(self.rng.choice(LITERALS[:20]) for _ in range(self.rng.randint(1, 3)))
            return k + re.escape(fixed) + ")"
        if k == "cond":
            if self.groups:
                return "(?(%d)%s|%s)" % (self.rng.randint(1, self.groups), inner,
                                         self.rng.choice(LITERALS))
            return "(?:" + inner + ")"
        if k == "ref":
            if self.names and self.rng.random() < 0.5:
                return "(?P=%s)" % self.rng.choice(self.names)
            if self.groups:
                return "\\%d" % self.rng.randint(1, self.groups)
            return "(?:a)"
        return k + inner + ")"

    def piece(self, depth):
        a = self.atom(depth)
        if a in ANCHORS or self.rng.random() < 0.6:
            return a
        qs = ["*", "+", "?", "{2}", "{1,3}", "{2,}", "{,2}", "{0}", "{,}", "{0,1}"]
        if a.startswith("(") and any(c in a for c in "*+?{"):
            qs = ["?", "{2}", "{0,1}", "{0}"]  # no nested unbounded loops: Python's re is exponential
        q = self.rng.choice(qs)
        tail = self.rng.choice(["", "", "?"] + (["+"] if self.backtrack else []))
        return a + q + tail

    def seq(self, depth):
        return "".join(self.piece(depth) for _ in range(self.rng.randint(0, 4)))

    def alt(self, depth):
        n = 1 if self.rng.random() < 0.7 else self.rng.randint(2, 3)
        return "|".join(self.seq(depth) for _ in range(n))

    def pattern(self):
        self.groups = 0
        self.names = []
        p = self.alt(0)
        if self.rng.random() < 0.15:
            p = self.rng.choice(["(?s)", "(?m)", "(?a)", "(?sm)", "(?x)", "(?u)", "(?ms)"]) + p
        return p


def random_path(rng):
    parts = [rng.choice(SEGMENTS) for _ in range(rng.randint(0, 5))]
    s = "/".join(parts)
    if rng.random() < 0.1:
        s += "\n"
    if rng.random() < 0.05:
        # invalid UTF-8 bytes, as shardplan maps them
        b = s.encode() + bytes([rng.choice([0x80, 0xC3, 0xE2, 0xFF, 0xED])]) + b"a"
        s = b.decode("utf-8", "surrogateescape")
    return s


def hexs(s):
    return s.encode("utf-8", "surrogateescape").hex()


BAD = ["(", ")", "a)", "(a", "[a", "[]", "[a-", "*a", "a**", "a{2}{3}", "^*", "\\", "a\\",
       "\\q", "\\1", "(a)\\2", "(?P<1a>x)", "(?P<a>x)(?P<a>y)", "(?P=b)", "(?P<a>(?P=a))",
       "[z-a]", "[\\w-z]", "a{3,2}", "(?z)", "(?<a)", "(?<=a*)", "(?<=a|bc)", "a(?i)",
       "(?L)a", "(?au)a", "(?-a:b)", "(?s-s:a)", "(?#", "\\x4", "\\u12", "\\U00110000",
       "[\\A]", "[\\9]", "\\400", "(?(1)a|b)", "(?(x)a)", "(a)(?(1)b|c|d)", "(?", "(?P", "(?P<",
       "(?P<a", "x|*", "(?:)+*", "[\\Z]", "a{,}b{1,2,3}"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=20261123)
    ap.add_argument("--patterns", type=int, default=600)
    ap.add_argument("--paths", type=int, default=8)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    records = []

    def add_pattern(p, paths):
        try:
            c = re.compile(p)
        except re.error as e:
            records.append({"k": "e", "p": hexs(p), "pos": e.pos, "msg": e.msg})
            return
        except (OverflowError, RecursionError):
            return
        for s in paths:
            records.append({"k": "m", "p": [hexs(p)], "s": hexs(s),
                            "r": 0 if c.search(s) else -1})

    for i in range(args.patterns):
        g = Gen(rng, backtrack=i % 4 == 3)
        p = g.pattern()
        if rng.random() < 0.08:  # a mutation: often a syntax error
            k = rng.randrange(len(p) + 1)
            p = p[:k] + rng.choice("()[]{}*+?|\\-^$") + p[k:]
        add_pattern(p, [random_path(rng) for _ in range(args.paths)])
    for p in BAD:
        add_pattern(p, [random_path(rng) for _ in range(2)])
    # Whole tables: the first entry found wins.
    for _ in range(args.patterns // 10):
        table = []
        while len(table) < rng.randint(2, 6):
            p = Gen(rng, backtrack=rng.random() < 0.2).pattern()
            try:
                table.append((p, re.compile(p)))
            except re.error:
                pass
        for _ in range(args.paths):
            s = random_path(rng)
            first = next((i for i, (_, c) in enumerate(table) if c.search(s)), -1)
            records.append({"k": "m", "p": [hexs(p) for p, _ in table], "s": hexs(s), "r": first})

    with open(args.out, "w", encoding="ascii") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
