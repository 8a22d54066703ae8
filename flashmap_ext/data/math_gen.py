"""Procedural math prompts (`flashmap data generate --source mathgen`): word problems, arithmetic and algebra.

Written for this library (Apache-2.0, no third-party text): each item comes from one of the `FAMILIES`
below (shopping, rates, work, percentages, ratios, ages, linear equations, systems, order of operations,
fractions, geometry, interest, averages, unit conversion, quadratics, number theory, probability,
sequences, time, savings, recipes) with names, objects, numbers and phrasing drawn by a generator seeded
with the item's id, so item `i` is the same text on every machine and run, whatever the count asked. The
numbers are chosen so every answer is exact (whole numbers or simple fractions). The corpus treats these
like the packaged sets: duplicates dropped, 13-gram decontaminated against every benchmark prompt, held out
by the hash of the text (`data.prompts.packaged_prompts`).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

NAMES = ("Ava", "Ben", "Chloe", "Diego", "Elena", "Farid", "Grace", "Hiro", "Isla", "Jamal", "Keiko", "Liam",
         "Maya", "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Victor", "Wen", "Yusuf", "Zoe")
ITEMS = (("notebook", "notebooks"), ("pencil", "pencils"), ("apple", "apples"), ("ticket", "tickets"),
         ("book", "books"), ("shirt", "shirts"), ("candle", "candles"), ("plant", "plants"), ("mug", "mugs"),
         ("puzzle", "puzzles"), ("sandwich", "sandwiches"), ("poster", "posters"), ("battery", "batteries"))
VEHICLES = ("car", "train", "bus", "cyclist", "boat", "runner", "truck")
JOBS = (("paint a fence", "painting"), ("fill a pool", "filling"), ("pack the boxes", "packing"),
        ("mow the lawn", "mowing"), ("clean the hall", "cleaning"))
ASK = ("", "Show your work.", "Explain each step.", "Give the final answer at the end.", "Solve step by step.")


@dataclass(frozen=True)
class GeneratedSet:
    """A procedural prompt set in the shape `data.prompts.packaged_prompts` reads (name, domain, source,
    licence) and its items."""
    name: str
    domain: str
    source: str
    licence: str
    count: int

    def items(self) -> list[tuple[str, str]]:
        """[(item id, prompt text)]: item i of family FAMILIES[i % len(FAMILIES)], seeded by its id."""
        out = []
        for i in range(self.count):
            name, make = FAMILIES[i % len(FAMILIES)]
            rng = random.Random(f"{self.name}:{i}")
            text = make(rng)
            ask = rng.choice(ASK)
            out.append((f"{name}-{i}", f"{text} {ask}".strip()))
        return out


def _poly(*terms: tuple[int, str]) -> str:
    """'3x - y + 5' from [(3, 'x'), (-1, 'y'), (5, '')]: zero terms dropped, unit coefficients bare."""
    out = ""
    for coef, var in terms:
        if coef == 0:
            continue
        mag = abs(coef)
        body = f"{'' if mag == 1 and var else mag}{var}"
        out += (f"-{body}" if coef < 0 else body) if not out else f" {'-' if coef < 0 else '+'} {body}"
    return out or "0"


def _shopping(r):
    n, (_, many) = r.choice(NAMES), r.choice(ITEMS)
    k, price = r.randint(2, 12), r.choice([1.25, 1.5, 2, 2.5, 3, 3.75, 4, 4.5, 5, 6, 7.5, 8, 12])
    k2, (_, many2), price2 = r.randint(2, 9), r.choice(ITEMS), r.randint(2, 15)
    paid = ((k * price + k2 * price2) // 10 + 1 + r.randint(0, 3)) * 10
    return r.choice([
        f"{n} buys {k} {many} at ${price:g} each and {k2} {many2} at ${price2} each. {n} pays with ${paid:g}. "
        f"How much change does {n} get back?",
        f"A store sells {many} for ${price:g} each and {many2} for ${price2} each. If {n} buys {k} {many} and "
        f"{k2} {many2}, how much does {n} spend in total?",
    ])


def _rate(r):
    v, speed, hours = r.choice(VEHICLES), r.randint(4, 90), r.choice([2, 3, 4, 5, 1.5, 2.5])
    speed2 = speed + r.randint(5, 30)
    return r.choice([
        f"A {v} travels at {speed} km per hour for {hours:g} hours, then at {speed2} km per hour for "
        f"{r.randint(1, 4)} more hours. How far does the {v} travel in total?",
        f"A {v} covers {int(speed * hours * 2)} km in {hours * 2:g} hours. At the same speed, how long "
        f"will it take to cover {speed * r.randint(3, 9)} km?",
        f"Two {v}s start from the same place and move in opposite directions, one at {speed} km/h and the "
        f"other at {speed2} km/h. How far apart are they after {hours:g} hours?",
    ])


def _work(r):
    a, b = r.sample(NAMES, 2)
    job, doing = r.choice(JOBS)
    ta, tb = r.choice([(2, 3), (3, 6), (4, 12), (5, 20), (6, 3), (10, 15), (12, 4), (6, 12), (8, 24)])
    return r.choice([
        f"{a} can {job} in {ta} hours and {b} can do it in {tb} hours. How long does it take them working "
        f"together?",
        f"Working alone, {a} needs {ta} hours to {job}. With {b}'s help it takes "
        f"{Fraction(ta * tb, ta + tb)} hours. How long would {b} need alone?",
    ])


def _percent(r):
    n, (one, _) = r.choice(NAMES), r.choice(ITEMS)
    price, pct = r.choice([20, 40, 50, 60, 80, 120, 150, 200, 250, 400]), r.choice([5, 10, 15, 20, 25, 30, 40])
    return r.choice([
        f"A {one} costs ${price}. It is on sale for {pct}% off, and then a {r.choice([5, 8, 10])}% sales tax "
        f"is added to the sale price. What does {n} pay?",
        f"The price of a {one} rose from ${price} to ${price + price * pct // 100}. By what percent did the "
        f"price increase?",
        f"{n} scored {r.randint(30, 48)} out of 50 on a test. What percentage is that?",
        f"A town had {price * 100} residents. The population grew by {pct}% one year and fell by "
        f"{r.choice([5, 10, 20])}% the next. How many residents are there now?",
    ])


def _ratio(r):
    a, b, c = r.sample(NAMES, 3)
    x, y, z = r.randint(1, 7), r.randint(1, 7), r.randint(1, 5)
    total = (x + y) * r.randint(3, 40)
    return r.choice([
        f"{a} and {b} share ${total} in the ratio {x}:{y}. How much does each get?",
        f"{a}, {b} and {c} split {(x + y + z) * r.randint(2, 25)} marbles in the ratio {x}:{y}:{z}. How many "
        f"marbles does {c} get?",
        f"In a class the ratio of boys to girls is {x}:{y}. There are {x * r.randint(2, 8)} boys. How many "
        f"students are in the class?",
    ])


def _ages(r):
    a, b = r.sample(NAMES, 2)
    age_b, k, years = r.randint(3, 15), r.randint(2, 4), r.randint(2, 12)
    return r.choice([
        f"{a} is {k} times as old as {b}. In {years} years the sum of their ages will be "
        f"{age_b * (k + 1) + 2 * years}. How old is {b} now?",
        f"{a} is {age_b + years} years old and {b} is {age_b} years old. How many years ago was {a} twice as "
        f"old as {b}?" if age_b > years else
        f"{a} is {age_b * k} years old, which is {k} times {b}'s age. How old will {b} be in {years} years?",
    ])


def _linear(r):
    a, x, b = r.randint(2, 12), r.randint(-15, 20), r.randint(-30, 30)
    c = r.randint(1, 9)
    lhs = _poly((a, "x"), (b, ""))
    return r.choice([
        f"Solve for x: {lhs} = {a * x + b}.",
        f"Find x if {lhs} = {_poly((c, 'x'), (a * x + b - c * x, ''))}." if a != c else
        f"Solve for x: {lhs} = {a * x + b}.",
        f"What value of x makes {a}(x - {c}) = {a * (x - c)} true?",
    ])


def _system(r):
    x, y = r.randint(-9, 12), r.randint(-9, 12)
    a, b, c, d = r.randint(1, 6), r.randint(1, 6), r.randint(1, 6), r.randint(-6, 6)
    if a * d == b * c:
        d += 7
    return r.choice([
        f"Solve the system of equations: {_poly((a, 'x'), (b, 'y'))} = {a * x + b * y} and "
        f"{_poly((c, 'x'), (d, 'y'))} = {c * x + d * y}.",
        f"The sum of two numbers is {x + y + 30} and their difference is {abs(x - y)}. Find the two numbers.",
    ])


def _expression(r):
    a, b, c, d = (r.randint(2, 20) for _ in range(4))
    return r.choice([
        f"Evaluate {a} + {b} * {c} - {d}.",
        f"Compute ({a} + {b}) * {c} - {d} * {r.randint(2, 5)}.",
        f"What is {a * d} / {d} + {b}^2 - {c}?",
        f"Calculate {a} * ({b} - {c}) + {d}.",
    ])


def _fractions(r):
    p, q, s, t = r.randint(1, 9), r.randint(2, 12), r.randint(1, 9), r.randint(2, 12)
    n = r.choice(NAMES)
    return r.choice([
        f"Add the fractions {p}/{q} and {s}/{t} and simplify the result.",
        f"Multiply {p}/{q} by {s}/{t} and write the answer in lowest terms.",
        f"{n} ate {p}/{q + p} of a pizza and a friend ate {s}/{t + s} of it. What fraction of the pizza is "
        f"left?",
        f"What is {p}/{q} of {q * r.randint(2, 30)}?",
    ])


def _geometry(r):
    w, h, rad = r.randint(2, 40), r.randint(2, 40), r.randint(1, 20)
    return r.choice([
        f"A rectangle is {w} cm long and {h} cm wide. What are its area and perimeter?",
        f"A right triangle has legs of {3 * rad} and {4 * rad} units. What is the length of its hypotenuse "
        f"and its area?",
        f"A circle has a radius of {rad} m. What are its area and circumference? Use pi = 3.14.",
        f"A rectangular garden of {w} m by {h} m has a path {r.randint(1, 3)} m wide all around it. What is "
        f"the area of the path?",
        f"A box is {w} cm by {h} cm by {rad} cm. What is its volume?",
    ])


def _interest(r):
    n = r.choice(NAMES)
    p, rate, years = r.choice([500, 1000, 1200, 2000, 2500, 5000, 8000]), r.choice([2, 3, 4, 5, 6, 8, 10]), \
        r.randint(2, 6)
    return r.choice([
        f"{n} deposits ${p} at a simple interest rate of {rate}% per year. How much interest is earned after "
        f"{years} years?",
        f"${p} is invested at {rate}% interest compounded yearly. What is it worth after {min(years, 3)} "
        f"years?",
        f"A loan of ${p} charges {rate}% simple interest per year. What is the total to repay after {years} "
        f"years?",
    ])


def _averages(r):
    xs = [r.randint(50, 100) for _ in range(r.randint(3, 6))]
    n = r.choice(NAMES)
    return r.choice([
        f"Find the mean, median and range of these numbers: {', '.join(map(str, xs))}.",
        f"{n}'s first {len(xs)} test scores are {', '.join(map(str, xs))}. What score does {n} need on the "
        f"next test to average {sum(xs) // len(xs) + r.randint(1, 4)}?",
    ])


def _units(r):
    v = r.randint(2, 95)
    return r.choice([
        f"Convert {v} kilometers to meters and to centimeters.",
        f"How many minutes are in {v} hours? How many seconds?",
        f"A jug holds {v * 250} milliliters. How many liters is that?",
        f"Convert {v * 12} inches to feet.",
        f"A car uses {r.randint(4, 9)} liters of fuel per 100 km. How much fuel does it need for {v * 10} km?",
    ])


def _quadratic(r):
    p, q = r.randint(-9, 9), r.randint(-9, 9)
    b, c = -(p + q), p * q
    return r.choice([
        f"Solve {_poly((1, 'x^2'), (b, 'x'), (c, ''))} = 0.",
        f"Find two numbers whose sum is {p + q} and whose product is {c}.",
        f"Factor the expression {_poly((1, 'x^2'), (b, 'x'), (c, ''))}.",
    ])


def _number_theory(r):
    a, b = r.randint(6, 120), r.randint(6, 120)
    return r.choice([
        f"Find the greatest common divisor and the least common multiple of {a} and {b}.",
        f"Write the prime factorization of {a * b}.",
        f"What is the remainder when {a * b + r.randint(1, 50)} is divided by {r.randint(3, 13)}?",
        f"How many multiples of {r.randint(3, 9)} are there between 1 and {a * b}?",
        f"Is {a * 7 + 1} a prime number?",
    ])


def _probability(r):
    red, blue, green = r.randint(1, 9), r.randint(1, 9), r.randint(1, 9)
    return r.choice([
        f"A bag has {red} red, {blue} blue and {green} green marbles. What is the probability of drawing a "
        f"blue marble?",
        f"A bag has {red} red and {blue} blue marbles. Two are drawn without replacement. What is the "
        f"probability that both are red?",
        f"Two fair dice are rolled. What is the probability that the sum is {r.randint(2, 12)}?",
        f"A coin is flipped {r.randint(3, 6)} times. What is the probability of getting exactly "
        f"{r.randint(1, 3)} heads?",
    ])


def _sequences(r):
    a, d, n = r.randint(-10, 20), r.randint(2, 9), r.randint(8, 40)
    return r.choice([
        f"An arithmetic sequence starts {a}, {a + d}, {a + 2 * d}, ... What is its {n}th term?",
        f"Find the sum of the first {n} terms of the arithmetic sequence {a}, {a + d}, {a + 2 * d}, ...",
        f"A geometric sequence starts {abs(a) + 1}, {(abs(a) + 1) * 2}, {(abs(a) + 1) * 4}, ... What is the "
        f"{r.randint(5, 10)}th term?",
        f"What is the sum of all whole numbers from 1 to {n * 5}?",
    ])


def _time(r):
    n = r.choice(NAMES)
    h, m, dur = r.randint(6, 11), r.choice([0, 10, 15, 20, 30, 45, 50]), r.randint(35, 290)
    return r.choice([
        f"{n} starts a trip at {h}:{m:02d} a.m. and travels for {dur} minutes. At what time does {n} arrive?",
        f"A movie starts at {h + 8}:{m:02d} and ends at {h + 9 + dur // 120}:{(m + 5) % 60:02d} (24-hour "
        f"clock). How long is it in minutes?",
        f"{n} works {r.randint(5, 9)} hours a day, {r.randint(3, 6)} days a week, for {r.randint(2, 8)} weeks "
        f"at ${r.randint(9, 30)} per hour. How much does {n} earn?",
    ])


def _savings(r):
    n = r.choice(NAMES)
    (_, many), start, weekly, goal = r.choice(ITEMS), r.randint(0, 60), r.randint(5, 40), r.randint(150, 900)
    return r.choice([
        f"{n} has ${start} and saves ${weekly} every week. How many weeks until {n} has at least ${goal}?",
        f"{n} earns ${weekly * 10} a month, spends {r.choice([20, 25, 40, 50])}% of it on rent and "
        f"${weekly} on {many}. How much is left each month?",
    ])


def _recipe(r):
    servings, new, flour = r.randint(2, 8), r.randint(3, 24), r.randint(1, 6)
    sugar = r.choice(["1/2", "3/4", "1/3", "2/3", "1", "1 1/2"])
    return r.choice([
        f"A recipe for {servings} people uses {flour} cups of flour and {sugar} cup of sugar. How much of "
        f"each is needed for {new} people?",
        f"A baker uses {flour * 250} g of flour per loaf and has {flour * 250 * new + r.randint(0, 200)} g. "
        f"How many loaves can the baker make, and how much flour is left?",
    ])


FAMILIES: tuple[tuple[str, Callable[[random.Random], str]], ...] = (
    ("shopping", _shopping), ("rate", _rate), ("work", _work), ("percent", _percent), ("ratio", _ratio),
    ("ages", _ages), ("linear", _linear), ("system", _system), ("expression", _expression),
    ("fractions", _fractions), ("geometry", _geometry), ("interest", _interest), ("averages", _averages),
    ("units", _units), ("quadratic", _quadratic), ("number", _number_theory), ("probability", _probability),
    ("sequences", _sequences), ("time", _time), ("savings", _savings), ("recipe", _recipe))

MATHGEN = GeneratedSet("mathgen", "math", "flashmap_ext.data.math_gen (procedural, this library)",
                       "Apache-2.0 (generated by this library)", 12000)
