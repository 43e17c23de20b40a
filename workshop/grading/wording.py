"""Small words of the failure messages: "1 token", "2 tokens", "the 2nd call"."""


def plural(count, noun, nouns=None):
    """'1 token', '2 tokens', '0 tokens'; `nouns` for an irregular plural ('1 entry', '3 entries')."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def ordinal(n):
    """'1st', '2nd', '3rd', '4th', '11th', '12th', '13th', '21st', '102nd'."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
