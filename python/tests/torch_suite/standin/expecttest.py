"""A stand-in for the `expecttest` package (Debian 12 does not package it),
which torch.testing._internal.common_utils imports for its TestCase base.
Only what torch's DataLoader tests reach: the ACCEPT flag and the inline
expectation asserts, which compare (they never rewrite a file)."""

import textwrap
import unittest

ACCEPT = False


def _normalize(text):
    return textwrap.dedent(text).strip("\n")


class TestCase(unittest.TestCase):
    longMessage = True

    def assertExpectedInline(self, actual, expect, skip=0):
        self.assertEqual(_normalize(expect), _normalize(actual))

    def assertExpectedRaisesInline(self, exc_type, callable, expect, *args,
                                   **kwargs):
        try:
            callable(*args, **kwargs)
        except exc_type as e:
            self.assertExpectedInline(str(e), expect)
            return
        self.fail(f"Did not raise when expected to: {exc_type.__name__}")
