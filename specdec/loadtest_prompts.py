"""The load test's chat prompts: eight everyday kinds of request, each request its own.

A load test that sends the same few prompts over and over measures a server's memory, not its
speed: a drafter with a server-wide cache of earlier answers (suffix decoding, `hybrid`) drafts a
repeated greedy answer whole (acceptance ~0.9, 3-4x plain decoding), which real traffic seldom
allows. So by default request i gets `distinct_prompt(i)`: kind i % 8 with its slots filled by a
mixed-radix count, so no two of a run's first 2,400 requests ask the same thing while every request of
a kind shares its template, as a product's traffic does. `REPEATED` keeps the eight fixed prompts (`--prompts
repeated`), the case where remembering earlier answers is the point.
"""
from __future__ import annotations

REPEATED = (
    'Repeat exactly: {"user": "ada", "roles": ["admin", "dev"], "active": true}',
    "Write a Python function that checks whether a string is a palindrome.",
    "Give three tips for writing clear emails.",
    "Rewrite in the passive voice: The committee approved the new budget on Monday.",
    "List the planets of the solar system in order from the sun.",
    "Explain what a hash table is in two sentences.",
    "Translate to French: The weather is nice today and we are going to the park.",
    "Summarise: Speculative decoding lets a small model draft tokens that a large model verifies in one pass.",
)

NAMES = ("ada", "grace", "linus", "barbara", "ken", "margaret", "dennis", "frances", "alan", "radia", "edsger",
         "sophie", "john", "hedy", "donald", "katherine", "tim", "anita", "guido", "shafi")
ROLES = (("admin", "dev"), ("viewer",), ("ops", "oncall"), ("billing", "support"), ("dev", "qa", "release"),
         ("auditor",), ("research", "dev"), ("sales",), ("owner", "admin"), ("intern", "docs"))
FUNCTIONS = ("checks whether a string is a palindrome", "returns the n-th Fibonacci number",
             "counts the vowels in a sentence", "merges two sorted lists", "removes duplicates from a list",
             "reverses the words of a sentence", "checks whether a number is prime",
             "returns the largest value in a dictionary", "flattens a nested list", "converts Celsius to Fahrenheit",
             "computes the greatest common divisor of two integers", "splits a list into chunks of size k",
             "counts word frequencies in a text", "validates an email address with a regular expression",
             "returns the median of a list of numbers", "rotates a matrix by 90 degrees",
             "parses a date in the form YYYY-MM-DD", "finds the longest common prefix of several strings",
             "computes a running average of a list", "checks whether two strings are anagrams")
STYLES = ("with type hints", "with a docstring", "without using any imports", "in one line if possible",
          "and add two tests")
TOPICS = ("writing clear emails", "staying focused while studying", "running a productive meeting",
          "saving money on groceries", "sleeping better", "learning a new language", "giving a short talk",
          "reviewing code", "keeping a houseplant alive", "starting to run", "planning a weekend trip",
          "writing a cover letter", "organizing a small kitchen", "onboarding a new colleague",
          "taking notes in lectures", "reducing screen time", "preparing for a job interview",
          "debugging a failing test", "cooking rice well", "keeping a journal")
AUDIENCES = ("", " for beginners", " for busy parents", " for students", " for remote workers")
SUBJECTS = ("The committee", "Our neighbour", "The chef", "A young engineer", "The city council", "My sister",
            "The orchestra", "The new manager", "A local bakery", "The research team", "The gardener",
            "The museum", "Our teacher", "The airline", "The mayor", "The volunteers")
ACTIONS = ("approved the new budget on Monday", "painted the old fence", "cooked a dinner for forty guests",
           "fixed the broken server", "closed the main road", "wrote a letter to the newspaper",
           "performed the symphony twice", "hired three designers", "baked bread before dawn",
           "published the results last week", "planted twelve apple trees", "opened a new wing",
           "graded the essays overnight", "cancelled the morning flight", "announced a new park",
           "cleaned the river bank")
LISTS = ("the planets of the solar system in order from the sun", "the days of the week starting on Monday",
         "the first ten prime numbers", "the continents by area, largest first", "the colours of a rainbow",
         "the months that have 31 days", "the noble gases", "the oceans of the world",
         "the bones of the human arm", "the stages of the water cycle", "five common sorting algorithms",
         "the layers of the OSI model", "the phases of the moon", "the parts of a flower",
         "the primary and secondary colours", "five renewable energy sources")
CONCEPTS = ("a hash table", "recursion", "a binary search tree", "photosynthesis", "inflation", "a compiler",
            "public-key cryptography", "a neural network", "supply and demand", "an operating system", "DNA",
            "a black hole", "a database index", "garbage collection", "a mutex", "the greenhouse effect",
            "a REST API", "plate tectonics", "a cache", "an interest rate")
LENGTHS = ("in two sentences", "to a ten-year-old", "in one paragraph", "with an example")
PLACES = ("the park", "the market", "the library", "the beach", "the museum", "the station", "the mountains",
          "the cinema", "the river", "the old town", "the stadium", "the zoo")
WEATHER = ("The weather is nice today", "It is raining this morning", "The sun is shining",
           "It is cold and windy", "The sky is clear tonight", "It snowed all night")
LANGUAGES = ("French", "Spanish", "German", "Italian")
FACTS = ("Speculative decoding lets a small model draft tokens that a large model verifies in one pass",
         "Bees communicate the location of flowers through a dance", "The printing press spread literacy in Europe",
         "Caching keeps recent results close so that repeated requests are served quickly",
         "Volcanoes form where magma reaches the surface of the earth",
         "Batching many requests together keeps a GPU busy", "Tides are caused mainly by the pull of the moon",
         "A balanced diet contains proteins, fats, carbohydrates, vitamins and minerals",
         "Version control records every change made to a project's files",
         "Coral reefs shelter about a quarter of all marine species",
         "Interest compounds when earnings are reinvested", "Migrating birds navigate using the earth's magnetic field")
SECOND = ("", " It was first described long ago.", " Many people find this surprising.",
          " Researchers are still studying it.", " It matters more every year.")


def _pick(k: int, *choices: tuple) -> list:
    """The k-th combination of the choices (mixed radix, first choice fastest): distinct for distinct k
    below the product of their lengths."""
    picked = []
    for options in choices:
        picked.append(options[k % len(options)])
        k //= len(options)
    return picked


OPENINGS = ("", "Please help. ", "Quick question: ", "Hi! ", "For a project: ")
MOST_DISTINCT = 8 * 60 * len(OPENINGS)  # requests before prompts repeat: the smallest kind has 60 slot fillings


def distinct_prompt(index: int) -> str:
    """Request `index`'s prompt: kind index % 8, its slots (then an opening) counted from index // 8;
    the first MOST_DISTINCT requests are all different."""
    kind, k = index % 8, index // 8
    opening = OPENINGS[(k // 60) % len(OPENINGS)]
    return opening + _kind_prompt(kind, k % 60 + 60 * (k // (60 * len(OPENINGS))))


def _kind_prompt(kind: int, k: int) -> str:
    if kind == 0:
        name, roles, active = _pick(k, NAMES, ROLES, ("true", "false"))
        listed = ", ".join(f'"{r}"' for r in roles)
        return f'Repeat exactly: {{"user": "{name}", "roles": [{listed}], "active": {active}, "id": {k}}}'
    if kind == 1:
        task, style = _pick(k, FUNCTIONS, STYLES)
        return f"Write a Python function that {task}, {style}."
    if kind == 2:
        topic, audience = _pick(k, TOPICS, AUDIENCES)
        return f"Give three tips for {topic}{audience}."
    if kind == 3:
        subject, action = _pick(k, SUBJECTS, ACTIONS)
        return f"Rewrite in the passive voice: {subject} {action}."
    if kind == 4:
        things, how = _pick(k, LISTS, ("", " as a numbered list", " in one line", " with one fact each"))
        return f"List {things}{how}."
    if kind == 5:
        concept, length = _pick(k, CONCEPTS, LENGTHS)
        return f"Explain what {concept} is {length}."
    if kind == 6:
        weather, place, language = _pick(k, WEATHER, PLACES, LANGUAGES)
        return f"Translate to {language}: {weather} and we are going to {place}."
    fact, second = _pick(k, FACTS, SECOND)
    return f"Summarise: {fact}.{second}"


def prompt_for(index: int, repeated: bool) -> str:
    return REPEATED[index % len(REPEATED)] if repeated else distinct_prompt(index)
