"""Truncation-token categories and histograms (tsanalysis.core.truncation; Figure 5)."""

import pytest

from tsanalysis.core.truncation import CATEGORIES, categorize_token, category_shares, token_label, truncation_histogram


@pytest.mark.parametrize("text, cat", [
    ("So", "discourse"), ("ĠSo", "discourse"), (" so", "discourse"), ("▁Therefore", "discourse"),
    ("Wait", "discourse"), (" Hmm", "discourse"), ("So,", "discourse"), ("ĠAlternatively", "discourse"),
    ("The", "discourse"), ("Ġthen", "discourse"),
    ("3", "digit"), ("Ġ12", "digit"), ("3.5", "digit"), ("1,000", "digit"),
    ("+", "operator"), (" =", "operator"), ("^", "operator"), ("<", "operator"), ("*", "operator"), ("-", "operator"),
    ("\\frac", "latex"), ("Ġ\\cdot", "latex"), ("\\boxed", "latex"), ("\\(", "latex"), ("$", "latex"),
    ("\n", "whitespace"), ("Ċ", "whitespace"), ("ĊĊ", "whitespace"), (" ", "whitespace"), ("Ġ", "whitespace"),
    ("x", "other"), ("Ġcircle", "other"), ("(", "other"), ("3x", "other"), ("", "other"), (None, "other"),
])
def test_categorize_token(text, cat):
    assert categorize_token(text) == cat


def test_token_label_is_printable():
    assert token_label("ĠSo") == "␣So"
    assert token_label("\n") == "\\n"
    assert token_label("Ċ") == "\\n"
    assert token_label(None) == "<none>"


def test_histogram_counts_shares_and_categories():
    texts = ["ĠSo", "ĠSo", " Let", "Wait"] + ["3", "+", "\\frac", "\n", "x", "ĠSo"] + ["ignored"]
    rules = ["entropy"] * 4 + ["ratio"] * 6 + [None]
    h = truncation_histogram(texts, rules, top=30)
    assert list(h.columns) == ["rule", "rank", "token", "label", "count", "share", "category", "rule_total"]
    ent = h[h["rule"] == "entropy"]
    assert ent["token"].tolist() == ["ĠSo", " Let", "Wait"]            # count desc, ties by token text
    assert ent["count"].tolist() == [2, 1, 1]
    assert ent["share"].tolist() == [0.5, 0.25, 0.25]
    assert set(ent["category"]) == {"discourse"}
    rat = h[h["rule"] == "ratio"]
    assert rat["count"].sum() == 6 and (rat["rule_total"] == 6).all()
    assert dict(zip(rat["token"], rat["category"])) == {"3": "digit", "+": "operator", "\\frac": "latex",
                                                        "\n": "whitespace", "x": "other", "ĠSo": "discourse"}
    # top cuts the list but shares stay relative to all cuts of the rule
    h2 = truncation_histogram(texts, rules, top=1)
    assert h2["token"].tolist() == ["ĠSo", "\n"] and h2["share"].tolist() == [0.5, pytest.approx(1 / 6)]

    c = category_shares(texts, rules)
    assert len(c) == 2 * len(CATEGORIES)
    ce = c[c["rule"] == "entropy"].set_index("category")
    assert ce.loc["discourse", "share"] == 1.0 and ce.loc["digit", "count"] == 0
    cr = c[c["rule"] == "ratio"].set_index("category")
    assert (cr["count"] == 1).all() and cr["share"].sum() == pytest.approx(1.0)


def test_histogram_input_checks():
    with pytest.raises(ValueError, match="2 token texts but 1 rules"):
        truncation_histogram(["a", "b"], ["ratio"])
    with pytest.raises(ValueError, match="top"):
        truncation_histogram(["a"], ["ratio"], top=0)
