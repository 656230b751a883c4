"""GSM8K-style word problems: a seeded generator, fixed train/test splits shipped as
JSONL under ``cases/data/``, and one loader for them and for real ``openai/gsm8k``.

A template is a question with named integer slots and 2-4 steps; each step is one binary
operation (+ - * /) over slots and earlier step results, stated the way GSM8K solutions are:
``She sold 48/2 = <<48/2=24>>24 clips in May.`` and a final ``#### 72``. Sampling rejects draws
whose intermediate results are not integers in [0, 9999] (division is always exact), so every
problem has one integer answer reachable by the annotated arithmetic.

Row format = GSM8K's: ``{"question": str, "answer": str}``; plus ``template`` (int) here.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
SPLITS = {"train": 4000, "test": 600}  # the shipped files (regenerate with ``python -m cases.gsm8k_synth``)
SPLIT_SEED = {"train": 1, "test": 2}
MAX_VALUE = 9999
NAMES = ("Ava", "Ben", "Carla", "Dev", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jamal", "Kira", "Leo", "Mina",
         "Noah", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tara")


@dataclass(frozen=True)
class Template:
    question: str  # str.format over {name} and the slots
    slots: dict  # slot -> (lo, hi) inclusive
    steps: tuple  # (result name, left, op, right, sentence with {expr}); left/right: slot or earlier result


T = Template
TEMPLATES = (
    T("{name} sold {a} clips in April and half as many in May. How many clips did {name} sell in total?",
      {"a": (2, 400)}, (("m", "a", "/", 2, "In May {name} sold {expr} clips."),
                        ("t", "a", "+", "m", "In total {name} sold {expr} clips."))),
    T("A box holds {a} pencils. {name} buys {b} boxes and gives away {c} pencils. How many pencils are left?",
      {"a": (2, 48), "b": (2, 30), "c": (1, 200)}, (("p", "a", "*", "b", "{name} buys {expr} pencils."),
                                                     ("r", "p", "-", "c", "{expr} pencils are left."))),
    T("{name} earns ${a} per hour and works {b} hours a week. Rent is ${c} a week. How much is left each week?",
      {"a": (8, 60), "b": (5, 50), "c": (50, 900)}, (("e", "a", "*", "b", "{name} earns {expr} dollars."),
                                                     ("r", "e", "-", "c", "After rent {expr} dollars are left."))),
    T("There are {a} apples shared equally among {b} baskets. Each basket then gets {c} more apples. How many "
      "apples are in one basket?", {"a": (10, 2000), "b": (2, 20), "c": (1, 90)},
      (("e", "a", "/", "b", "Each basket first gets {expr} apples."),
       ("r", "e", "+", "c", "One basket has {expr} apples."))),
    T("A train travels {a} km each hour for {b} hours, then {c} km more. How far does it travel?",
      {"a": (20, 300), "b": (2, 12), "c": (5, 400)}, (("d", "a", "*", "b", "First it travels {expr} km."),
                                                      ("t", "d", "+", "c", "In all it travels {expr} km."))),
    T("{name} has {a} stickers, gets {b} more, then splits them evenly into {c} albums. How many stickers are in "
      "each album?", {"a": (10, 900), "b": (1, 500), "c": (2, 12)},
      (("s", "a", "+", "b", "{name} has {expr} stickers."), ("r", "s", "/", "c", "Each album holds {expr} stickers."))),
    T("A farm has {a} cows. Each cow gives {b} liters of milk a day. The farm sells {c} liters a day. How many "
      "liters are left each day?", {"a": (3, 90), "b": (2, 30), "c": (1, 500)},
      (("m", "a", "*", "b", "The cows give {expr} liters."), ("r", "m", "-", "c", "{expr} liters are left."))),
    T("A shop had {a} shirts. It sold {b} on Monday and {c} on Tuesday. How many shirts remain?",
      {"a": (50, 3000), "b": (1, 900), "c": (1, 900)}, (("s", "b", "+", "c", "The shop sold {expr} shirts."),
                                                        ("r", "a", "-", "s", "{expr} shirts remain."))),
    T("{name} reads {a} pages a day for {b} days and then {c} pages on the last day. How many pages did {name} "
      "read?", {"a": (5, 80), "b": (2, 30), "c": (1, 99)}, (("p", "a", "*", "b", "First {name} reads {expr} pages."),
                                                             ("t", "p", "+", "c", "{name} read {expr} pages."))),
    T("A baker makes {a} muffins and packs them {b} to a box. Each box sells for ${c}. How much money does the "
      "baker make?", {"a": (12, 1200), "b": (2, 12), "c": (2, 25)},
      (("x", "a", "/", "b", "There are {expr} boxes."), ("m", "x", "*", "c", "The baker makes {expr} dollars."))),
    T("{name} saves ${a} each week for {b} weeks, then spends ${c} on a bike and ${d} on a helmet. How much money "
      "is left?", {"a": (5, 90), "b": (2, 40), "c": (10, 900), "d": (5, 200)},
      (("s", "a", "*", "b", "{name} saves {expr} dollars."), ("p", "c", "+", "d", "The bike and helmet cost {expr} dollars."),
       ("r", "s", "-", "p", "{expr} dollars are left."))),
    T("A school has {a} classes with {b} students each. {c} students are absent. The rest sit in rows of {d}. How "
      "many rows are there?", {"a": (2, 30), "b": (10, 40), "c": (1, 90), "d": (2, 12)},
      (("s", "a", "*", "b", "The school has {expr} students."), ("p", "s", "-", "c", "{expr} students are present."),
       ("r", "p", "/", "d", "There are {expr} rows."))),
    T("{name} buys {a} notebooks at ${b} each and {c} pens at ${d} each. How much does {name} spend?",
      {"a": (1, 40), "b": (1, 30), "c": (1, 60), "d": (1, 9)},
      (("n", "a", "*", "b", "The notebooks cost {expr} dollars."), ("p", "c", "*", "d", "The pens cost {expr} dollars."),
       ("t", "n", "+", "p", "{name} spends {expr} dollars."))),
    T("A tank holds {a} liters. It loses {b} liters an hour for {c} hours. How many liters are still in the tank?",
      {"a": (100, 9000), "b": (2, 90), "c": (2, 24)}, (("l", "b", "*", "c", "The tank loses {expr} liters."),
                                                       ("r", "a", "-", "l", "{expr} liters are still in the tank."))),
    T("{name} packs {a} eggs into cartons of {b}. Each carton costs ${c}, and {name} also pays ${d} for delivery. "
      "What is the total cost?", {"a": (12, 2400), "b": (6, 12), "c": (1, 9), "d": (1, 60)},
      (("k", "a", "/", "b", "{name} needs {expr} cartons."), ("x", "k", "*", "c", "The cartons cost {expr} dollars."),
       ("t", "x", "+", "d", "The total cost is {expr} dollars."))),
    T("A garden has {a} rows of {b} tulips. Rabbits eat {c} tulips, and {name} plants {d} new ones. How many "
      "tulips are there now?", {"a": (2, 40), "b": (3, 50), "c": (1, 300), "d": (1, 300)},
      (("t", "a", "*", "b", "There were {expr} tulips."), ("e", "t", "-", "c", "After the rabbits {expr} tulips remain."),
       ("n", "e", "+", "d", "Now there are {expr} tulips."))),
    T("{name} runs {a} meters every morning and {b} meters every evening. How many meters does {name} run in "
      "{c} days?", {"a": (100, 3000), "b": (100, 3000), "c": (2, 7)},
      (("d", "a", "+", "b", "Each day {name} runs {expr} meters."), ("t", "d", "*", "c", "In all {name} runs {expr} meters."))),
    T("A library has {a} books. It gives {b} books to each of {c} schools and buys {d} new books. How many books "
      "does it have now?", {"a": (500, 9000), "b": (5, 90), "c": (2, 20), "d": (1, 800)},
      (("g", "b", "*", "c", "It gives away {expr} books."), ("l", "a", "-", "g", "{expr} books are left."),
       ("n", "l", "+", "d", "It has {expr} books now."))),
    T("Tickets cost ${a} for adults and ${b} for kids. A group of {c} adults and {d} kids buys tickets. How much "
      "do they pay?", {"a": (5, 60), "b": (2, 40), "c": (1, 30), "d": (1, 40)},
      (("x", "a", "*", "c", "Adult tickets cost {expr} dollars."), ("y", "b", "*", "d", "Kid tickets cost {expr} dollars."),
       ("t", "x", "+", "y", "They pay {expr} dollars."))),
    T("{name} has {a} marbles. {name} gives a third of them to a friend and then loses {b}. How many marbles does "
      "{name} have?", {"a": (3, 3000), "b": (1, 200)},
      (("g", "a", "/", 3, "{name} gives away {expr} marbles."), ("h", "a", "-", "g", "{name} keeps {expr} marbles."),
       ("r", "h", "-", "b", "{name} has {expr} marbles."))),
    T("A factory makes {a} toys an hour for {b} hours. It ships them in crates of {c}. How many crates does it "
      "fill?", {"a": (5, 400), "b": (2, 16), "c": (2, 50)},
      (("t", "a", "*", "b", "The factory makes {expr} toys."), ("r", "t", "/", "c", "It fills {expr} crates."))),
    T("{name} bakes {a} cookies, eats {b}, and shares the rest equally among {c} friends. Each friend gives {d} "
      "cookies back. How many cookies does one friend keep?", {"a": (20, 2000), "b": (1, 50), "c": (2, 12), "d": (1, 9)},
      (("l", "a", "-", "b", "{expr} cookies are left."), ("e", "l", "/", "c", "Each friend gets {expr} cookies."),
       ("k", "e", "-", "d", "One friend keeps {expr} cookies."))),
    T("A bus carries {a} people. At the first stop {b} get off and {c} get on. At the second stop the number of "
      "people doubles. How many people are on the bus?", {"a": (10, 2000), "b": (1, 900), "c": (1, 900)},
      (("x", "a", "-", "b", "After people get off {expr} remain."), ("y", "x", "+", "c", "Then there are {expr} people."),
       ("z", "y", "*", 2, "At the second stop there are {expr} people."))),
    T("A recipe needs {a} grams of flour per cake. {name} has {b} grams and bakes {c} cakes. How many grams of "
      "flour are left?", {"a": (50, 900), "b": (500, 9999), "c": (2, 9)},
      (("u", "a", "*", "c", "The cakes use {expr} grams."), ("r", "b", "-", "u", "{expr} grams are left."))),
)
OPS = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
       "/": lambda x, y: x // y if y and x % y == 0 else None}


def _solve(t: Template, vals: dict) -> list[tuple[str, int, str, int, int]] | None:
    env, out = dict(vals), []
    for res, left, op, right, _ in t.steps:
        x = env[left] if isinstance(left, str) else left
        y = env[right] if isinstance(right, str) else right
        r = OPS[op](x, y)
        if r is None or not 0 <= r <= MAX_VALUE or (op == "/" and y < 2):
            return None
        env[res] = r
        out.append((res, x, op, y, r))
    return out


def make_problem(rng: random.Random, template: int | None = None) -> dict:
    """One problem from a template (random when None): rejection-sampled until every step is valid."""
    k = rng.randrange(len(TEMPLATES)) if template is None else template
    t = TEMPLATES[k]
    for _ in range(10_000):
        vals = {s: rng.randint(lo, hi) for s, (lo, hi) in t.slots.items()}
        steps = _solve(t, vals)
        if steps is not None:
            break
    else:  # pragma: no cover - every template has reachable slots (tested)
        raise RuntimeError(f"template {k}: no valid draw")
    name = rng.choice(NAMES)
    lines = []
    for (res, x, op, y, r), (_, _, _, _, sentence) in zip(steps, t.steps):
        lines.append(sentence.format(name=name, expr=f"{x}{op}{y} = <<{x}{op}{y}={r}>>{r}"))
    answer = "\n".join(lines) + f"\n#### {steps[-1][-1]}"
    return {"question": t.question.format(name=name, **vals), "answer": answer, "template": k}


def generate(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [make_problem(rng) for _ in range(n)]


def path(split: str) -> Path:
    return DATA_DIR / f"gsm8k_synth_{split}.jsonl"


def write_splits(out_dir: Path = DATA_DIR) -> dict[str, Path]:
    """The shipped splits: train and test share no question."""
    out_dir.mkdir(parents=True, exist_ok=True)
    train = generate(SPLITS["train"], SPLIT_SEED["train"])
    seen = {r["question"] for r in train}
    test = [r for r in generate(SPLITS["test"] * 2, SPLIT_SEED["test"]) if r["question"] not in seen][: SPLITS["test"]]
    paths = {}
    for split, rows in (("train", train), ("test", test)):
        p = out_dir / f"gsm8k_synth_{split}.jsonl"
        p.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        paths[split] = p
    return paths


def data_hash(split: str) -> str:
    """sha256 of the shipped file: saved beside every trained model."""
    return hashlib.sha256(path(split).read_bytes()).hexdigest()[:16]


def load(split: str = "test", *, source: str = "synth", limit: int | None = None):
    """A ``datasets.Dataset`` with ``question`` and ``answer``: the shipped synthetic split
    (offline, ``load_dataset("json", ...)``) or real GSM8K (``openai/gsm8k``, config ``main``)
    when the hub is reachable."""
    import datasets

    if source == "synth":
        ds = datasets.load_dataset("json", data_files={split: str(path(split))}, split=split)
    elif source == "openai/gsm8k":
        ds = datasets.load_dataset("openai/gsm8k", "main", split=split)
    else:
        raise ValueError(f"source: expected 'synth' or 'openai/gsm8k', got {source!r}")
    return ds.select(range(min(limit, len(ds)))) if limit is not None else ds


_FINAL = re.compile(r"#### (\-?[0-9\.\,]+)")


def final_answer(answer: str) -> str | None:
    """The number after ``####`` (commas dropped), as GSM8K's own answers end."""
    m = _FINAL.search(answer)
    return m.group(1).strip().replace(",", "") if m else None


if __name__ == "__main__":
    for s, p in write_splits().items():
        print(s, p, p.stat().st_size, "bytes", data_hash(s))
