"""A metric definition's regex as SageMaker reads it: the value is the number its first group captures (a float), so a
regex without a group ranks nothing, and one whose first group can capture text (`.`, `\\S`, `[^ ]`, letters) fails to
parse; both are refused before the job starts. The regex is read with Python's own parser of regular expressions.

    from jobs import metric_regex  # from scripts/
    metric_regex.problem(r"loss=(\\S+)")  # 'its first group can capture text; ...'
"""

try:  # Python's own parser of regular expressions, as re compiles them
    from re import _parser as re_parser
except ImportError:  # before Python 3.11
    import sre_parse as re_parser

NUMBER = frozenset("0123456789.-+eE")  # the characters of a metric's value as SageMaker reads it (a float)


def parts(av) -> list:
    """The parsed expressions inside one parsed item's argument: a group's, a repeat's, each branch's."""
    found = []
    for part in av if isinstance(av, tuple) else (av,):
        found += [p for p in (part if isinstance(part, list) else [part]) if isinstance(p, re_parser.SubPattern)]
    return found


def first_group(items):
    """The parsed expression of a parsed regex's first group, or None."""
    for op, av in items:
        if str(op) == "SUBPATTERN" and av[0] == 1:
            return av[3]
        for part in parts(av):
            if (found := first_group(part)) is not None:
                return found
    return None


def numeric(items) -> bool:
    """Whether parsed `items` match only characters of a number (NUMBER): no `.`, `\\S`, `[^ ]`, letters."""
    for op, av in items:
        op = str(op)
        if op == "LITERAL":
            ok = chr(av) in NUMBER
        elif op == "IN":  # a class: its characters, ranges and \d only
            ok = all(
                chr(v) in NUMBER if str(k) == "LITERAL"
                else all(chr(c) in NUMBER for c in range(v[0], v[1] + 1)) if str(k) == "RANGE"
                else str(k) == "CATEGORY" and str(v) == "CATEGORY_DIGIT"
                for k, v in av
            )  # fmt: skip
        elif op in ("AT", "ASSERT", "ASSERT_NOT"):  # anchors and lookarounds match no character
            ok = True
        else:  # a group, a repeat, a branch: what is inside; anything else (., a back reference) any character
            ok = op in ("SUBPATTERN", "MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT", "BRANCH", "ATOMIC_GROUP")
            ok = ok and all(numeric(part) for part in parts(av))
        if not ok:
            return False
    return True


def problem(regex: str) -> str | None:
    """What keeps SageMaker from reading a metric with `regex`, or None: it reads the number its first group captures
    (a regex without a group ranks nothing; one whose group captures text fails to parse)."""
    group = first_group(re_parser.parse(regex))
    if group is None:
        return "its regex captures nothing; SageMaker reads the value its first group captures, e.g. loss=([0-9.]+)"
    if not numeric(group):
        return (
            "its first group can capture text; SageMaker reads a number there: make the group match the number alone, "
            "e.g. ([0-9.]+) or (-?[0-9.]+(?:e-?[0-9]+)?)"
        )
    return None
