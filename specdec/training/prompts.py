"""Offline training text: prompts written here and the Python standard library's own docstrings.

Why these: drafters must learn what the *target* says in reply to chat-style requests (writing, QA,
maths, translation, summarisation, retrieval, code), so the prompts mimic those task families and
the target's own greedy answers become the training text (self-distillation). Long passages to
summarise or answer from come from stdlib docstrings, which every Python install carries. Nothing
here reads Spec-Bench's question file: that is the test set.
"""
from __future__ import annotations

import ast
import random
import sysconfig
from functools import lru_cache
from pathlib import Path

from specdec.training import wordlists as W


def file_docstrings(path: Path, prefix: str, min_chars: int) -> list[tuple[str, str]]:
    """(name, docstring) pairs of one source file's module, classes and functions of at least min_chars:
    the module's as path.stem, the others as prefix.name; nothing from a file that does not parse."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (SyntaxError, ValueError):
        return []
    found = []
    for node in [tree, *ast.walk(tree)]:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= min_chars:
                found.append((path.stem if isinstance(node, ast.Module) else f"{prefix}.{node.name}", doc.strip()))
    return found


@lru_cache(maxsize=2)  # parsing ~400 files takes seconds; the result depends only on the install
def stdlib_docstrings(max_files: int = 400, min_chars: int = 200) -> tuple[tuple[str, str], ...]:
    """(name, docstring) pairs from the stdlib's modules, classes and functions, in a stable order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return tuple(pair for path in sorted(root.glob("*.py"))[:max_files]
                 for pair in file_docstrings(path, path.stem, min_chars))


PACKAGE_DIRS = ("numpy", "sympy", "networkx", "matplotlib", "jinja2", "click", "requests", "pygments", "rich",
                "httpx", "hypothesis", "pydantic", "yaml", "dateutil", "attr", "packaging", "markdown_it")


@lru_cache(maxsize=2)
def package_docstrings(max_files_per_package: int = 60, min_chars: int = 200) -> tuple[tuple[str, str], ...]:
    """(name, docstring) pairs from installed third-party packages (numpy, sympy, networkx, ...): a second,
    broader source of documentation than the stdlib (maths, graphs, plotting, HTTP, templating)."""
    root = Path(sysconfig.get_paths()["purelib"])
    return tuple(pair for package in PACKAGE_DIRS
                 for path in sorted((root / package).rglob("*.py"))[:max_files_per_package]
                 if not ("test" in path.parts[-2] or path.name.startswith("test"))
                 for pair in file_docstrings(path, package, min_chars))


def docstrings(source: str) -> tuple[tuple[str, str], ...]:
    """The documentation passages of a prompt source: "stdlib" or "packages"."""
    return package_docstrings() if source == "packages" else stdlib_docstrings()


def _math_problem(rng: random.Random) -> str:
    """A GSM8K-style word problem with fresh names and numbers."""
    a, b, c, d = rng.randint(2, 60), rng.randint(2, 30), rng.randint(2, 12), rng.randint(2, 9)
    p, q = rng.sample(W.PEOPLE, 2)
    item = rng.choice(W.ITEMS)
    return rng.choice((
        f"A shop sells {item} for {c} dollars each. {p} buys {a} {item} and pays with {a * c + b} dollars. "
        "How much change does {p} get? Explain step by step.",
        f"A train travels {a * c} kilometres in {c} hours. How far does it travel in {b} hours at the same speed?",
        f"{p} has {a} {item}. {p} gives {min(b, a)} to {q} and then buys {c} more. How many {item} does {p} have now?",
        f"Solve for x: {c}x + {b} = {c * a + b}. Show your work.",
        f"A rectangle has a length of {a} cm and a width of {b} cm. What are its area and perimeter?",
        f"What is {a}% of {b * 20}? Explain how you calculated it.",
        f"There are {a + c} students in a class and {c} of them are absent. What fraction of the class is present?",
        f"{p} earns {a * 5} dollars a week and saves {d} dollars more than half of it. How much does {p} save in "
        f"{c} weeks?",
        f"{p} reads {b} pages a day. {q} reads {b + d} pages a day. How many more pages does {q} read in {c} days?",
        f"A recipe needs {d} eggs for {c} people. How many eggs are needed for {c * d} people?",
        f"{p} bought {a} {item} at {c} dollars each and sold them at {c + d} dollars each. What was the profit?",
        f"A tank holds {a * 10} litres and leaks {d} litres an hour. How long until it holds {a * 10 - d * c} litres?",
        f"{p} is {a} years old. {q} is {b} years older. How old will {q} be in {c} years?"))


def _german(rng: random.Random) -> str:
    def sentence() -> str:
        return f"{rng.choice(W.GERMAN_SUBJECTS)} {rng.choice(W.GERMAN_PREDICATES)} {rng.choice(W.GERMAN_TIMES)}."
    return " ".join(sentence() for _ in range(rng.randint(1, 3)))


def _prompt(kind: int, rng: random.Random, name: str, doc: str) -> str:
    """One request of task family `kind` (0-13)."""
    passage = doc[:rng.choice((500, 800, 1100))]
    if kind == 0:
        return f"Write a {rng.choice(W.FORMS)} about {rng.choice(W.TOPICS)}.{rng.choice(W.CONSTRAINTS)}"
    if kind == 1:
        return rng.choice(W.QUESTION_FORMS).format(rng.choice(W.CONCEPTS))
    if kind in (2, 3):
        return _math_problem(rng)
    if kind == 4:
        return f"Translate German to English: {_german(rng)}"
    if kind == 5:
        return rng.choice(("Summarize the following text in a few sentences.", "Write a one-paragraph summary:",
                           "Give a short summary of this documentation.", "What are the main points of this text?")
                          ) + f"\n\n{passage}"
    if kind == 6:
        return rng.choice((f"Answer the question using the passage.\n\nPassage: {passage}\n\nQuestion: "
                           f"What does {name} do, and when would you use it?",
                           f"Passage: {passage}\n\nBased on the passage, what is {name.split('.')[-1]} for?",
                           f"Read this and answer briefly.\n{passage}\nQuestion: what does the text say about "
                           f"its arguments or options?"))
    if kind == 7:
        lang = rng.choice(W.LANGUAGES)
        return f"Write a {lang} function that {rng.choice(W.CODE_TASKS)}. Explain how it works."
    if kind == 8:
        return f"Pretend you are {rng.choice(W.ROLES)}. {rng.choice(W.SITUATIONS)}"
    if kind == 9:
        return rng.choice(W.FACT_QUESTIONS).format(c=rng.choice(W.COUNTRIES))
    if kind == 10:
        return rng.choice(W.PERSON_QUESTIONS).format(p=rng.choice(W.PEOPLE_FAMOUS))
    if kind == 11:
        return f"Explain the following documentation to a beginner:\n\n{passage[:600]}"
    if kind == 12:
        a, b = rng.sample(W.CONCEPTS, 2)
        return rng.choice((f"Compare and contrast {a} and {b}.", f"How are {a} and {b} related, if at all?",
                           f"Write a short essay connecting {a} and {b}."))
    return rng.choice((f"Extract the key terms from this text and list them with one-line definitions:\n\n{passage}",
                       f"Turn this documentation into a short FAQ with three questions and answers:\n\n{passage}",
                       f"Write a usage example for {name}, based on its documentation:\n\n{passage[:700]}"))


def chat_prompts(seed: int = 0, num_prompts: int = 320, source: str = "stdlib") -> list[str]:
    """num_prompts distinct requests, seeded, the task families in turn; different seeds give different
    prompts (families compose word lists, numbers and stdlib docstrings at random, so repeats are rare)."""
    rng = random.Random(seed)
    docs = list(docstrings(source))
    rng.shuffle(docs)
    prompts: dict[str, None] = {}
    attempts = 0
    while len(prompts) < num_prompts and attempts < 20 * num_prompts:
        name, doc = docs[attempts % len(docs)]
        prompts.setdefault(_prompt(attempts % 14, rng, name, doc), None)
        attempts += 1
    return list(prompts)


def stdlib_passages(num_passages: int, seed: int = 0, source: str = "stdlib") -> list[str]:
    """Raw docstring passages, teacher-forced (labels are then the target's own next-token argmax)."""
    docs = [doc for _, doc in docstrings(source)]
    random.Random(seed + 1).shuffle(docs)
    return docs[:num_passages]
