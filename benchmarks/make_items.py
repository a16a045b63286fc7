"""The committed task-item sets of benchmarks/data/items/: arithmetic, code completion and RYS-style digit probes,
each split into a `select` file (where a search chooses: its trials, chunk 0) and a `judge` file (items the choice
never saw, for `ilr-search judge` and for checking a peer tool's pick).

    python benchmarks/make_items.py [--out benchmarks/data/items] [--check]

Every set is drawn with its own fixed seed (SEEDS), so the same interpreter writes the same bytes; `--check`
rewrites nothing and exits 1 where a committed file differs from what this script makes. The code-completion set
is built from the embedded corpus (ilr_search.data.corpora.stdlib_documents: the running Python's standard library),
so it depends on the Python version: manifest.json records the one that wrote the files, with each file's rows and
SHA-256.

The sets (one JSON object a line; `prompt`, `answer`, `choices` are the columns `--text-column prompt
--answer-column answer --choices-column choices` name):

- arithmetic-{select,judge}.jsonl: "23+58=" -> "81" after three solved examples of the same kind, one a line
  ("14+27=41\\n35+12=47\\n61+20=81\\n23+58="). A third of the items at each level: one-digit operands (level 1;
  a difference: a one-digit subtrahend and result), a two-digit and a one-digit one (2), two two-digit ones (3; a
  product's second factor has one digit), cycling through +, - and * (a difference is never negative). `answer` is
  the result as text, so `--objective exact` (greedy decoding to the newline) scores it as it is; `choices` are the
  result and three distractors of the same number of digits where there are such (the result +-1, +-2, +-10, a
  swap of its last two digits), in a shuffled order, for `--objective choice`.
- code-{select,judge}.jsonl: a line of the standard library's Python code, cut after its first third to two thirds
  (at a space or a punctuation mark), with the two lines before it: `prompt` is those lines and the line's start,
  `choices` its true continuation and the continuations of three other lines of other files, cut the same way and
  of a similar length (within 40% of its characters), in a shuffled order; `answer` is the true continuation.
  Lines are code (not comments, docstrings or blank), 24 to 90 characters, each line used once.
- digits-{select,judge}.jsonl: prompts in layer-scan's math-probe form (a question, then "\\nAnswer: "), whose
  answer is one digit 0-9, computed here: arithmetic facts (last or leading digits, remainders), counting (primes,
  divisors, even numbers), powers and logarithms, percentages, probability and counting of outcomes, sequences,
  derivatives and integrals, geometry (polygons, right triangles, solids), RYS-style 0-9 ratings of a statement
  (9 true, 0 false) and of where a product lies on a stated 0-9 scale. Written from templates with drawn numbers,
  none of them layer-scan's 16 prompts. Each row has `choices` "0".."9" and `answer` the digit (for
  `--objective choice`: right when the correct digit is the most likely of the ten), and layer-scan's fields
  (`expected_score`, `correct_answer`, `category`). The correct digits are balanced: as many items of each digit,
  from as many templates as give it. digits-{select,judge}.probe.json hold the same prompts as layer-scan's custom
  probe file (`layer-scan scan --probe custom --custom-probe FILE`; its `scoring: digits` reads the mean expected
  digit over "0".."9" at the position after the prompt, which is what layer-scan's math probe reports).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OUT = ROOT / "benchmarks" / "data" / "items"
SEEDS = {"arithmetic": 4401, "code": 4402, "digits": 4403}
SIZES = {  # rows of (select, judge)
    "arithmetic": (160, 320),
    "code": (120, 240),
    "digits": (160, 320),
}
DIGITS = [str(d) for d in range(10)]

Row = dict[str, Any]


# --- arithmetic ---


def _arithmetic_case(rng: random.Random, level: int, op: str) -> tuple[int, int, int]:
    """Operands of `level` and the result: 1, one digit each (a difference: one-digit subtrahend and result);
    2, two digits and one; 3, two digits each, except a product, whose second factor has one. A difference is
    never negative."""
    if level == 1 and op == "-":
        b, c = rng.randint(1, 9), rng.randint(0, 9)
        return b + c, b, c
    a = rng.randint(1, 9) if level == 1 else rng.randint(10, 99)
    b = rng.randint(10, 99) if level == 3 and op != "*" else rng.randint(1 if op != "*" else 2, 9)
    if op == "-":
        a, b = max(a, b), min(a, b)
    return a, b, {"+": a + b, "-": a - b, "*": a * b}[op]


def _distractors(rng: random.Random, answer: int, k: int = 3) -> list[str]:
    """Wrong results near `answer`, of its number of digits where possible."""
    text = str(answer)
    near = {answer + d for d in (-10, -2, -1, 1, 2, 10)}
    if len(text) >= 2 and text[-1] != text[-2]:
        near.add(int(text[:-2] + text[-1] + text[-2]))
    near.discard(answer)
    pool = sorted(n for n in near if n >= 0)
    same = [n for n in pool if len(str(n)) == len(text)]
    other = [n for n in pool if len(str(n)) != len(text)]
    rng.shuffle(same)
    rng.shuffle(other)
    return [str(n) for n in (same + other)[:k]]


def arithmetic_rows(n: int, seed: int) -> list[Row]:
    """`n` items cycling through the three levels and three operations, each after three solved examples of its
    level and operation, no question twice."""
    rng = random.Random(seed)
    rows: list[Row] = []
    seen: set[str] = set()
    kinds = [(level, op) for level in (1, 2, 3) for op in "+-*"]
    for _ in range(100 * n):
        if len(rows) == n:
            break
        level, op = kinds[len(rows) % len(kinds)]
        shots = [_arithmetic_case(rng, level, op) for _ in range(3)]
        a, b, answer = _arithmetic_case(rng, level, op)
        question = f"{a}{op}{b}="
        if question in seen or any(f"{x}{op}{y}=" == question for x, y, _ in shots):
            continue
        seen.add(question)
        prompt = "".join(f"{x}{op}{y}={z}\n" for x, y, z in shots) + question
        choices = [str(answer), *_distractors(rng, answer)]
        rng.shuffle(choices)
        rows.append({"prompt": prompt, "answer": str(answer), "choices": choices, "level": level, "op": op})
    return rows


# --- code completion from the embedded corpus ---


def _is_code_line(line: str) -> bool:
    s = line.strip()
    if not 24 <= len(line.rstrip()) <= 90 or not s:
        return False
    if s[0] in "#\"'" or s.startswith(("r'", 'r"', "f'", 'f"', "b'", 'b"')):
        return False
    return any(c in s for c in "=()[].:") and sum(ch.isalpha() for ch in s) >= 8


def _cut(line: str, rng: random.Random) -> tuple[str, str] | None:
    """The line split after its first third to two thirds, at a space or punctuation mark, at least four characters
    past its indentation and before a character that is no space: (start, rest)."""
    text = line.rstrip()
    lo, hi = len(text) // 3, 2 * len(text) // 3
    indent = len(text) - len(text.lstrip())
    points = [
        i
        for i in range(max(lo, indent + 4), hi + 1)
        if text[i - 1] in " (.,[=:" and not text[i].isspace() and text[i:].strip()
    ]
    if not points:
        return None
    i = rng.choice(points)
    return text[:i], text[i:]


def _docstring_lines(text: str) -> set[int]:
    """Line numbers (0-based) of lines in or touching a triple-quoted string, by a plain scan of the quotes."""
    inside: set[int] = set()
    quote: str | None = None
    for n, line in enumerate(text.splitlines()):
        if '"""' not in line and "'''" not in line:
            if quote is not None:
                inside.add(n)
            continue
        inside.add(n)
        for match in re.finditer(r'"""|\'\'\'', line):
            q = match.group()
            if quote is None:
                quote = q
            elif quote == q:
                quote = None
    return inside


def code_rows(n: int, seed: int) -> list[Row]:
    from ilr_search.data.corpora import stdlib_documents

    rng = random.Random(seed)
    candidates: list[tuple[str, int, list[str]]] = []  # (file, line number, the file's lines)
    for key, text in stdlib_documents():
        if not key.endswith(".py"):
            continue
        lines = text.splitlines()
        skip = _docstring_lines(text)
        candidates += [(key, i, lines) for i in range(2, len(lines)) if i not in skip and _is_code_line(lines[i])]
    rng.shuffle(candidates)
    cuts: list[tuple[str, int, list[str], str, str]] = []
    used: set[str] = set()
    for key, i, lines in candidates:
        whole = lines[i].rstrip()
        if whole.strip() in used:
            continue
        cut = _cut(whole, rng)
        if cut is None:
            continue
        used.add(whole.strip())
        cuts.append((key, i, lines, *cut))
        if len(cuts) >= 6 * n:
            break
    items, pool = cuts[:n], cuts[n:]
    rows: list[Row] = []
    for key, i, lines, start, rest in items:
        near = [c for c in pool if c[0] != key and abs(len(c[4]) - len(rest)) <= 0.4 * len(rest) and c[4] != rest]
        if len(near) < 3:
            continue
        others = [c[4] for c in rng.sample(near, 3)]
        choices = [rest, *others]
        rng.shuffle(choices)
        context = "\n".join(line.rstrip() for line in lines[i - 2 : i])
        rows.append({"prompt": f"{context}\n{start}", "answer": rest, "choices": choices, "source": f"{key}:{i + 1}"})
    return rows


# --- RYS-style digit probes ---

ANSWER = "\nAnswer: "
Template = Callable[[random.Random], tuple[str, int] | None]


def _primes_upto(n: int) -> list[int]:
    sieve = [True] * (n + 1)
    sieve[0:2] = [False, False]
    for p in range(2, int(n**0.5) + 1):
        if sieve[p]:
            sieve[p * p :: p] = [False] * len(sieve[p * p :: p])
    return [i for i, is_p in enumerate(sieve) if is_p]


PRIMES = set(_primes_upto(2000))


def t_last_digit(r: random.Random) -> tuple[str, int]:
    a, b = r.randint(13, 999), r.randint(11, 99)
    return f"What is the last digit of {a} × {b}?", (a * b) % 10


def t_leading_digit(r: random.Random) -> tuple[str, int]:
    a, b = r.randint(21, 999), r.randint(11, 99)
    return f"Without writing out the full product, what is the first (leading) digit of {a} × {b}?", int(str(a * b)[0])


def t_remainder(r: random.Random) -> tuple[str, int]:
    m = r.randint(3, 10)
    v = r.randint(100, 9999)
    return f"What is the remainder when {v} is divided by {m}?", v % m


def t_prime_count(r: random.Random) -> tuple[str, int] | None:
    lo = r.randint(10, 150)
    hi = lo + r.randint(8, 40)
    k = sum(1 for p in range(lo + 1, hi) if p in PRIMES)
    return (f"How many prime numbers are there strictly between {lo} and {hi}?", k) if k <= 9 else None


def t_divisors(r: random.Random) -> tuple[str, int] | None:
    v = r.randint(10, 400)
    k = sum(1 for d in range(1, v + 1) if v % d == 0)
    return (f"How many positive divisors does {v} have?", k) if k <= 9 else None


def t_log(r: random.Random) -> tuple[str, int]:
    base = r.choice([2, 3, 10])
    k = r.randint(0, 9 if base == 2 else 6 if base == 3 else 9)
    return f"What is the logarithm base {base} of {base**k}?", k


def t_power_digits(r: random.Random) -> tuple[str, int] | None:
    k = r.randint(4, 29)
    v = 2**k
    return (f"How many digits does 2^{k} have when written out in full?", len(str(v))) if len(str(v)) <= 9 else None


def t_percent(r: random.Random) -> tuple[str, int] | None:
    p = r.choice([5, 10, 20, 25, 30, 40, 50, 60, 75])
    ans = r.randint(0, 9)
    if ans * 100 % p:
        return None
    return f"What is {p}% of {ans * 100 // p}?", ans


def t_discount(r: random.Random) -> tuple[str, int]:
    first, second = r.choice([(20, 25), (50, 20), (10, 10), (30, 20), (40, 50), (25, 20)])
    left = (100 - first) * (100 - second) / 100
    total = 100 - left
    return (
        f"A shop takes {first}% off a price, then {second}% off the reduced price. The total discount is what "
        f"percent, rounded to the nearest ten? Give the tens digit.",
        int(round(total / 10)) % 10,
    )


def t_dice(r: random.Random) -> tuple[str, int]:
    k = r.randint(0, 5)
    return f"A fair six-sided die is rolled. How many of its faces show a number greater than {k}?", 6 - k


def t_two_dice(r: random.Random) -> tuple[str, int] | None:
    s = r.randint(2, 12)
    k = sum(1 for a in range(1, 7) for b in range(1, 7) if a + b == s)
    return f"Two fair dice are rolled. In how many of the 36 outcomes do they sum to {s}?", k


def t_coins(r: random.Random) -> tuple[str, int]:
    n = r.randint(1, 8)
    return f"A fair coin is flipped {n} times. How many different numbers of heads are possible?", n + 1


def t_pigeonhole(r: random.Random) -> tuple[str, int]:
    colours = r.randint(2, 8)
    return (
        f"A drawer holds socks of {colours} colours. How many socks must you take, without looking, to be sure "
        "of two of the same colour?",
        colours + 1,
    )


def t_sequence(r: random.Random) -> tuple[str, int]:
    nxt = r.randint(0, 9)
    d = r.choice([-7, -5, -4, -3, -2, 2, 3, 4, 5, 6])
    terms = [nxt - d * k for k in range(4, 0, -1)]
    return f"What is the next term of the sequence {', '.join(map(str, terms))}, ...?", nxt


def t_geometric(r: random.Random) -> tuple[str, int] | None:
    ratio = r.choice([2, 3])
    nxt = r.choice([1, 2, 3, 4, 6, 8, 9])
    terms = [nxt * ratio**k for k in range(4, 0, -1)]
    return f"Each term is the previous one divided by {ratio}: {', '.join(map(str, terms))}, ... What comes next?", nxt


def t_derivative(r: random.Random) -> tuple[str, int] | None:
    c, n = r.randint(1, 4), r.randint(1, 4)
    x = r.choice([1, 1, 2])
    v = c * n * x ** (n - 1)
    term = f"{c}x^{n}" if c > 1 else f"x^{n}"
    return (f"What is the derivative of {term} evaluated at x = {x}?", v) if v <= 9 else None


def t_integral(r: random.Random) -> tuple[str, int] | None:
    k = r.randint(1, 9)
    b = r.randint(1, 3)
    if (2 * k) % (b * b):
        return None
    c = 2 * k // (b * b)
    return f"What is the integral of {c}x dx from 0 to {b}?", k


def t_polygon(r: random.Random) -> tuple[str, int]:
    n = r.choice([3, 4, 5, 6, 8, 9])
    angle = (n - 2) * 180 // n
    return f"A regular polygon has interior angles of {angle} degrees each. How many sides does it have?", n


def t_angle_sum(r: random.Random) -> tuple[str, int]:
    n = r.randint(3, 11)
    total = (n - 2) * 180
    return (
        f"The interior angles of a polygon add up to {total} degrees. How many straight angles (180 degrees) is that?",
        n - 2,
    )


def t_right_triangle(r: random.Random) -> tuple[str, int] | None:
    a, b, c = r.choice([(3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25), (9, 40, 41), (20, 21, 29)])
    s = r.randint(1, 3)
    a, b, c = a * s, b * s, c * s
    leg, other = (a, b) if r.random() < 0.5 else (b, a)
    if other > 9:
        return None
    return f"A right triangle has a hypotenuse of {c} and one leg of {leg}. How long is the other leg?", other


def t_solid(r: random.Random) -> tuple[str, int]:
    solid, parts = r.choice(
        [
            ("tetrahedron", {"faces": 4, "vertices": 4, "edges": 6}),
            ("cube", {"faces": 6, "vertices": 8}),
            ("octahedron", {"faces": 8, "vertices": 6}),
            ("square pyramid", {"faces": 5, "vertices": 5, "edges": 8}),
            ("triangular prism", {"faces": 5, "vertices": 6, "edges": 9}),
            ("pentagonal pyramid", {"vertices": 6, "faces": 6}),
            ("triangular bipyramid", {"vertices": 5, "faces": 6, "edges": 9}),
        ]
    )
    part = r.choice(sorted(parts))
    return f"How many {part} does a {solid} have?", parts[part]


def t_gcd(r: random.Random) -> tuple[str, int]:
    g = r.randint(1, 9)
    while True:
        x, y = r.randint(2, 30), r.randint(2, 30)
        if math.gcd(x, y) == 1 and x != y:
            break
    return f"What is the greatest common divisor of {g * x} and {g * y}?", g


def t_root(r: random.Random) -> tuple[str, int]:
    k = r.randint(0, 9)
    if r.random() < 0.5:
        return f"What is the square root of {k * k}?", k
    return f"What is the cube root of {k**3}?", k


def t_mean(r: random.Random) -> tuple[str, int]:
    m = r.randint(1, 9)
    n = r.randint(3, 5)
    offsets = [r.randint(-m, 9) for _ in range(n - 1)]
    values = [m + o for o in offsets]
    values.append(m * n - sum(values))
    if min(values) < 0:
        return t_mean(r)
    r.shuffle(values)
    return f"What is the mean of {', '.join(map(str, values))}?", m


def t_even_count(r: random.Random) -> tuple[str, int] | None:
    lo = r.randint(1, 80)
    hi = lo + r.randint(2, 17)
    k = sum(1 for v in range(lo, hi + 1) if v % 2 == 0)
    return (f"How many even numbers are there from {lo} to {hi}, both included?", k) if k <= 9 else None


def t_division(r: random.Random) -> tuple[str, int]:
    k, d = r.randint(0, 9), r.randint(12, 97)
    return f"What is {k * d} divided by {d}?", k


def t_statement(r: random.Random) -> tuple[str, int]:
    """A RYS-style rating of a statement: 9 where it is true, 0 where it is false."""
    kind = r.randrange(5)
    if kind == 0:
        v = r.choice([p for p in range(50, 400) if p in PRIMES] + [a * b for a in (7, 11, 13, 17) for b in (7, 11, 13)])
        claim, truth = f"{v} is a prime number", v in PRIMES
    elif kind == 1:
        a, b = r.randint(12, 99), r.randint(12, 99)
        c = a * b + r.choice([0, 0, -10, 10, -1, 1])
        claim, truth = f"{a} × {b} = {c}", a * b == c
    elif kind == 2:
        x, y = r.randint(4, 15), r.randint(4, 15)
        z = x + y + r.choice([-1, 0, 1])
        claim, truth = f"√{x * x} + √{y * y} > {z}", x + y > z
    elif kind == 3:
        p, q, s, t = r.randint(1, 9), r.randint(2, 12), r.randint(1, 9), r.randint(2, 12)
        if p * t == s * q:
            return t_statement(r)
        claim, truth = f"{p}/{q} is greater than {s}/{t}", p * t > s * q
    else:
        v = r.randint(10, 99) ** 2 + r.choice([0, 0, 1, -1])
        claim, truth = f"{v} is a perfect square", math.isqrt(v) ** 2 == v
    return f"Rate from 0-9 how confident you are that {claim} (9: certainly true, 0: certainly false).", (
        9 if truth else 0
    )


def t_scale(r: random.Random) -> tuple[str, int]:
    """RYS's estimation form: where a product lies on a stated 0-9 scale of even steps."""
    a, b = r.randint(21, 899), r.randint(11, 99)
    v = a * b
    step = 10 ** max(1, len(str(v)) - 2)
    d = r.randint(0, 9)
    lo = (round(v / step) - d) * step
    if lo < 0:
        return t_scale(r)
    return (
        f"Estimate {a} × {b}. On a scale where 0 means {lo} and each step adds {step} (so 9 means {lo + 9 * step}), "
        "which step is closest?",
        d,
    )


DIGIT_TEMPLATES: dict[str, Template] = {
    "last-digit": t_last_digit,
    "leading-digit": t_leading_digit,
    "remainder": t_remainder,
    "primes": t_prime_count,
    "divisors": t_divisors,
    "logarithm": t_log,
    "powers": t_power_digits,
    "percentage": t_percent,
    "discount": t_discount,
    "dice": t_dice,
    "two-dice": t_two_dice,
    "coins": t_coins,
    "pigeonhole": t_pigeonhole,
    "sequence": t_sequence,
    "geometric": t_geometric,
    "derivative": t_derivative,
    "integral": t_integral,
    "polygon": t_polygon,
    "angle-sum": t_angle_sum,
    "right-triangle": t_right_triangle,
    "solid": t_solid,
    "gcd": t_gcd,
    "root": t_root,
    "mean": t_mean,
    "even-count": t_even_count,
    "division": t_division,
    "statement": t_statement,
    "scale": t_scale,
}


def digit_rows(n: int, seed: int) -> list[Row]:
    """`n` digit items (n a multiple of 10), n/10 of each correct digit, drawn round-robin from the templates
    that give it, no prompt twice."""
    rng = random.Random(seed)
    pool: dict[int, dict[str, list[str]]] = {d: {} for d in range(10)}
    seen: set[str] = set()
    for _ in range(400):
        for name, template in DIGIT_TEMPLATES.items():
            made = template(rng)
            if made is None:
                continue
            question, digit = made
            if question in seen or not 0 <= digit <= 9:
                continue
            seen.add(question)
            pool[digit].setdefault(name, []).append(question)
    by_digit: dict[int, list[Row]] = {}
    per_digit = n // 10
    for digit in range(10):
        names = sorted(pool[digit])
        rng.shuffle(names)
        taken: list[Row] = []
        while len(taken) < per_digit:
            progressed = False
            for name in names:
                if pool[digit][name] and len(taken) < per_digit:
                    taken.append(
                        {
                            "prompt": pool[digit][name].pop() + ANSWER,
                            "answer": str(digit),
                            "choices": DIGITS,
                            "correct_answer": digit,
                            "expected_score": float(digit),
                            "category": name,
                        }
                    )
                    progressed = True
            if not progressed:
                raise RuntimeError(f"too few distinct items of digit {digit}")
        rng.shuffle(taken)
        by_digit[digit] = taken
    # in rounds of one item of each digit, so that any first 10k rows hold k of each
    rows: list[Row] = []
    for j in range(per_digit):
        order = list(range(10))
        rng.shuffle(order)
        rows += [by_digit[d][j] for d in order]
    return rows


def probe_file(rows: list[Row], name: str) -> dict[str, Any]:
    """The rows as layer-scan's custom probe file (layer_scan/probes/custom.py)."""
    return {
        "name": name,
        "description": f"{len(rows)} RYS-style digit items (benchmarks/make_items.py); the answer is one digit",
        "scoring": "digits",
        "samples": [
            {
                "prompt": row["prompt"],
                "expected_score": row["expected_score"],
                "correct_answer": row["correct_answer"],
                "metadata": {"category": row["category"]},
            }
            for row in rows
        ],
    }


# --- writing ---


def jsonl(rows: list[Row]) -> bytes:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")


def files() -> dict[str, bytes]:
    """Every file of the item folder: name -> bytes."""
    made: dict[str, bytes] = {}
    builders = {"arithmetic": arithmetic_rows, "code": code_rows, "digits": digit_rows}
    for name, build in builders.items():
        n_select, n_judge = SIZES[name]
        rows = build(n_select + n_judge, SEEDS[name])
        if len(rows) < n_select + n_judge:
            raise RuntimeError(f"{name}: made {len(rows)} rows of {n_select + n_judge}")
        parts = {"select": rows[:n_select], "judge": rows[n_select : n_select + n_judge]}
        for part_rows in parts.values():  # each part in its own shuffled order
            random.Random(SEEDS[name] + 1).shuffle(part_rows)
        for part, part_rows in parts.items():
            made[f"{name}-{part}.jsonl"] = jsonl(part_rows)
            if name == "digits":
                probe = probe_file(part_rows, f"digits-{part}")
                made[f"{name}-{part}.probe.json"] = (json.dumps(probe, indent=1, ensure_ascii=False) + "\n").encode()
    manifest = {
        "made_by": "benchmarks/make_items.py",
        "python": sys.version.split()[0],
        "seeds": SEEDS,
        "files": {
            name: {
                "rows": data.count(b"\n") if name.endswith(".jsonl") else None,
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
            for name, data in sorted(made.items())
        },
    }
    made["manifest.json"] = (json.dumps(manifest, indent=1) + "\n").encode()
    return made


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="compare with the files in --out; write nothing")
    args = ap.parse_args()
    made = files()
    if args.check:
        differ = [n for n, data in made.items() if not (args.out / n).is_file() or (args.out / n).read_bytes() != data]
        for name in differ:
            print(f"differs: {args.out / name}")
        raise SystemExit(1 if differ else 0)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, data in made.items():
        (args.out / name).write_bytes(data)
        print(f"{args.out / name}: {len(data):,} bytes")


if __name__ == "__main__":
    main()
