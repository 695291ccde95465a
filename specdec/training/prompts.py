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

TOPICS = ("a lighthouse keeper", "the first day of spring", "a robot learning to paint", "a lost city under the sea",
          "friendship between a cat and a crow", "a journey across the desert", "climate change", "a small bakery",
          "the history of the printing press", "learning a new language", "a rainy night in Tokyo", "space travel",
          "a chess tournament", "the importance of sleep", "an old library", "volunteering", "a mountain village",
          "artificial intelligence in medicine", "a family reunion", "the ocean at dawn", "a time traveller",
          "renewable energy", "a detective in Victorian London", "a school garden", "the last dragon")
FORMS = ("short poem", "short story", "persuasive essay", "formal email", "blog post", "speech", "haiku sequence",
         "product description", "diary entry", "dialogue between two friends", "news article", "travel guide")
CONCEPTS = ("photosynthesis", "inflation", "machine learning", "the water cycle", "black holes", "democracy",
            "vaccines", "the stock market", "gravity", "DNA", "plate tectonics", "the French Revolution",
            "blockchain", "compound interest", "the immune system", "quantum computing", "supply and demand",
            "climate change", "the Renaissance", "electric cars", "the internet", "evolution", "antibiotics",
            "the speed of light", "recursion in programming", "nuclear fusion", "the Roman Empire", "biodiversity",
            "cloud computing", "the greenhouse effect", "a hash table", "entropy", "the Pythagorean theorem",
            "the Industrial Revolution", "operating systems", "probability", "volcanoes", "the human heart")
QUESTION_FORMS = ("What is {}?", "Explain {} in simple terms.", "Why is {} important?",
                  "Give three key facts about {}.", "How would you explain {} to a ten-year-old?",
                  "What are the advantages and disadvantages of {}?", "Describe the history of {}.")
ROLES = ("a pirate captain", "a medieval knight", "a friendly librarian", "a sports coach", "a famous chef",
         "a tour guide in Rome", "a job interviewer", "a detective", "a spaceship pilot", "a kindergarten teacher")
CODE_TASKS = ("reverses a string", "checks whether a number is prime", "computes the Fibonacci sequence",
              "merges two sorted lists", "counts word frequencies in a text", "finds the longest common prefix",
              "implements binary search", "removes duplicates from a list while keeping order",
              "parses a CSV file and sums a column", "validates an email address with a regular expression",
              "computes the factorial of n recursively", "flattens a nested list", "implements a stack class",
              "converts Celsius to Fahrenheit", "finds the second largest number in a list",
              "checks whether a string is a palindrome", "computes the greatest common divisor")
GERMAN = ("Der Hund spielt im Garten mit einem Ball.", "Ich habe gestern ein sehr interessantes Buch gelesen.",
          "Die Regierung hat neue Maßnahmen zum Klimaschutz beschlossen.", "Morgen fahren wir mit dem Zug nach Berlin.",
          "Das Wetter ist heute schön, aber es wird am Abend regnen.", "Kannst du mir bitte helfen, den Tisch zu tragen?",
          "Die Wissenschaftler haben eine neue Art von Frosch entdeckt.", "Meine Schwester arbeitet als Ärztin in München.",
          "Wir müssen die Ergebnisse der Studie sorgfältig prüfen.", "Der Film war länger als erwartet, aber sehr spannend.",
          "Die Stadt plant, mehr Fahrradwege zu bauen.", "Nach dem Essen gingen wir am Fluss spazieren.",
          "Das Unternehmen hat im letzten Jahr einen Rekordgewinn erzielt.", "Kinder lernen Sprachen oft schneller als Erwachsene.")
LANGUAGES = ("French", "Spanish", "German", "Italian")


@lru_cache(maxsize=2)  # parsing ~400 files takes seconds; the result depends only on the install
def stdlib_docstrings(max_files: int = 400, min_chars: int = 200) -> tuple[tuple[str, str], ...]:
    """(name, docstring) pairs from the stdlib's modules, classes and functions, in a stable order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[tuple[str, str]] = []
    for path in sorted(root.glob("*.py"))[:max_files]:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        for node in [tree, *ast.walk(tree)]:
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= min_chars:
                    name = path.stem if isinstance(node, ast.Module) else f"{path.stem}.{node.name}"
                    found.append((name, doc.strip()))
    return tuple(found)


def _math_problem(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 60), rng.randint(2, 30), rng.randint(2, 12)
    return rng.choice((
        f"A shop sells pencils for {c} dollars each. Maria buys {a} pencils and pays with {a * c + b} dollars. "
        "How much change does she get? Explain step by step.",
        f"A train travels {a * c} kilometres in {c} hours. How far does it travel in {b} hours at the same speed?",
        f"Tom has {a} apples. He gives {min(b, a)} to his friend and then buys {c} more. How many apples does he have?",
        f"Solve for x: {c}x + {b} = {c * a + b}. Show your work.",
        f"A rectangle has a length of {a} cm and a width of {b} cm. What are its area and perimeter?",
        f"What is {a}% of {b * 20}? Explain how you calculated it.",
        f"There are {a} students in a class and {c} of them are absent. What fraction of the class is present?"))


def chat_prompts(seed: int = 0, num_prompts: int = 320) -> list[str]:
    """A seeded mix of task families, shuffled; the first num_prompts are returned."""
    rng = random.Random(seed)
    docs = list(stdlib_docstrings())
    rng.shuffle(docs)
    prompts: list[str] = []
    for i in range(num_prompts * 2):
        kind = i % 9
        name, doc = docs[i % len(docs)]
        passage = doc[:1200]
        if kind == 0:
            prompts.append(f"Write a {rng.choice(FORMS)} about {rng.choice(TOPICS)}.")
        elif kind == 1:
            prompts.append(rng.choice(QUESTION_FORMS).format(rng.choice(CONCEPTS)))
        elif kind == 2:
            prompts.append(_math_problem(rng))
        elif kind == 3:
            prompts.append(f"Translate German to English: {rng.choice(GERMAN)}" if rng.random() < 0.6 else
                           f"Translate into {rng.choice(LANGUAGES)}: {doc.split('.')[0]}.")
        elif kind == 4:
            prompts.append(f"Summarize the following text in a few sentences.\n\n{passage}")
        elif kind == 5:
            prompts.append(f"Answer the question using the passage.\n\nPassage: {passage}\n\n"
                           f"Question: What does {name} do, and when would you use it?")
        elif kind == 6:
            prompts.append(f"Write a Python function that {rng.choice(CODE_TASKS)}. Explain how it works.")
        elif kind == 7:
            prompts.append(f"Pretend you are {rng.choice(ROLES)}. Describe your typical day.")
        else:
            prompts.append(f"Explain the following documentation to a beginner:\n\n{passage[:600]}")
    rng.shuffle(prompts)
    return prompts[:num_prompts]


def stdlib_passages(num_passages: int, seed: int = 0) -> list[str]:
    """Raw docstring passages, teacher-forced (labels are then the target's own next-token argmax)."""
    docs = [doc for _, doc in stdlib_docstrings()]
    random.Random(seed + 1).shuffle(docs)
    return docs[:num_passages]
