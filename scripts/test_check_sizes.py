#!/usr/bin/env python3
"""What scripts/check_sizes.py counts as a function, on made-up sources: a gtest TEST body is
one and its lines are counted from the TEST line; a lambda inside a table's initialiser or inside
a function is not one of its own; preprocessor lines before a function are not part of it; a
file over the limit and a function over it are reported. (ctest sizes.selftest)"""
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_sizes  # noqa: E402


def body(n):
    """n lines of statements."""
    return "".join(f"  x += {k};\n" for k in range(n))


class Functions(unittest.TestCase):
    def test_a_test_body_is_a_function_from_its_test_line(self):
        text = "#include <gtest/gtest.h>\n\nnamespace {\n\nTEST(Suite, Name) {\n" + body(3) + "}\n}\n"
        # TEST on line 5, three statements on 6-8, the closing brace on 9
        self.assertEqual(check_sizes.functions(text), [(5, 9)])

    def test_fixture_and_parameterised_tests_are_functions(self):
        text = "TEST_F(Fix, A) {\n}\nTEST_P(Par, B) {\n  int y = 0;\n}\n"
        self.assertEqual(check_sizes.functions(text), [(1, 2), (3, 5)])

    def test_preprocessor_lines_do_not_start_the_next_function(self):
        text = "#include <a>\n#define M(x) { x }\n#if 1\nvoid f() {\n}\n#endif\n"
        self.assertEqual(check_sizes.functions(text), [(4, 5)])

    def test_lambdas_in_a_table_or_a_function_are_not_functions(self):
        text = ("const std::vector<Row> kRows = {\n  {\"neg\", [](double x) { return -x; }},\n"
                "  {\"abs\", [](double x) {\n    return x < 0 ? -x : x;\n  }},\n};\n"
                "void g() {\n  auto h = [](int a) {\n    return a;\n  };\n}\n")
        self.assertEqual(check_sizes.functions(text), [(7, 11)])

    def test_members_are_functions_and_braces_in_strings_do_not_count(self):
        text = "class C {\n public:\n  int f() const {\n    return '{' + \"}}\";\n  }\n};\n"
        self.assertEqual(check_sizes.functions(text), [(3, 5)])


class Limits(unittest.TestCase):
    def test_a_long_test_body_and_a_long_file_are_reported(self):
        with tempfile.TemporaryDirectory() as d:
            long_test = Path(d) / "long_test.cpp"
            long_test.write_text("TEST(A, B) {\n" + body(check_sizes.MAX_FUNCTION - 1) + "}\n")
            self.assertEqual(check_sizes.main([d]), 1)  # MAX_FUNCTION + 1 lines
            long_test.write_text("TEST(A, B) {\n" + body(check_sizes.MAX_FUNCTION - 2) + "}\n")
            self.assertEqual(check_sizes.main([d]), 0)  # MAX_FUNCTION lines
            (Path(d) / "long.hpp").write_text("int x;\n" * (check_sizes.MAX_FILE + 1))
            self.assertEqual(check_sizes.main([d]), 1)

    def test_near_lists_without_failing(self):
        with tempfile.TemporaryDirectory() as d:
            near = Path(d) / "near_test.cpp"
            # 95 lines: above 90% of 100, within the limit
            near.write_text("TEST(A, B) {\n" + body(93) + "}\n")
            self.assertEqual(check_sizes.main([d], near=True), 0)
            near.write_text("TEST(A, B) {\n" + body(99) + "}\n")  # 101 lines
            self.assertEqual(check_sizes.main([d], near=True), 1)


if __name__ == "__main__":
    unittest.main()
