"""Word lists the training prompts are composed from (written here; plain data, no logic).

Combined by `specdec.training.prompts`, they give tens of thousands of distinct requests across the
task families a chat model is asked (writing, role play, reasoning, maths, code, extraction, STEM and
humanities questions, German->English, summaries, answers from a passage), so the target's answers
to them, the self-distillation text, do not repeat.
"""
TOPICS = (
    "a lighthouse keeper", "the first day of spring", "a robot learning to paint", "a lost city under the sea",
    "friendship between a cat and a crow", "a journey across the desert", "climate change", "a small bakery",
    "the history of the printing press", "learning a new language", "a rainy night in Tokyo", "space travel",
    "a chess tournament", "the importance of sleep", "an old library", "volunteering", "a mountain village",
    "artificial intelligence in medicine", "a family reunion", "the ocean at dawn", "a time traveller",
    "renewable energy", "a detective in Victorian London", "a school garden", "the last dragon",
    "a city without cars", "a musician who lost her hearing", "the first colony on Mars", "a forgotten toy",
    "a long train journey", "remote work", "a street market", "the smell of rain", "a retired astronaut",
    "a tiny island", "social media", "a night at the museum", "an unlikely hero", "a broken promise",
    "the life of a honeybee", "a winter festival", "recycling", "a startup's first year", "an abandoned house",
    "a football final", "the power of kindness", "a letter from the future", "a village doctor",
    "online privacy", "a garden in the city", "a wolf pack", "the invention of the telephone", "a storm at sea",
    "public libraries", "a first job", "a child's first snowfall", "electric bicycles", "a haunted castle",
    "a marathon runner", "the northern lights", "a grandmother's recipe", "a mystery package", "fast fashion",
)
FORMS = (
    "short poem", "short story", "persuasive essay", "formal email", "blog post", "speech", "haiku sequence",
    "product description", "diary entry", "dialogue between two friends", "news article", "travel guide",
    "limerick", "opening paragraph of a novel", "movie pitch", "letter to the editor", "motivational message",
    "restaurant review", "job advertisement", "short fable with a moral", "tweet thread", "podcast intro",
)
CONSTRAINTS = (
    "", "", "", " Keep it under 150 words.", " Use a humorous tone.", " Write it for children.",
    " Make it sad but hopeful.", " Use vivid imagery.", " End with a surprising twist.", " Use simple language.",
    " Include a title.", " Write it in the first person.", " Make it formal.", " Use three paragraphs.",
)
CONCEPTS = (
    "photosynthesis", "inflation", "machine learning", "the water cycle", "black holes", "democracy", "vaccines",
    "the stock market", "gravity", "DNA", "plate tectonics", "the French Revolution", "blockchain",
    "compound interest", "the immune system", "quantum computing", "supply and demand", "the Renaissance",
    "electric cars", "the internet", "evolution", "antibiotics", "the speed of light", "recursion in programming",
    "nuclear fusion", "the Roman Empire", "biodiversity", "cloud computing", "the greenhouse effect",
    "a hash table", "entropy", "the Pythagorean theorem", "the Industrial Revolution", "operating systems",
    "probability", "volcanoes", "the human heart", "the Cold War", "neural networks", "the periodic table",
    "opportunity cost", "the Silk Road", "cryptography", "the nervous system", "tides", "the Big Bang",
    "impressionism", "the printing press", "encryption", "sorting algorithms", "the carbon cycle", "magnetism",
    "the Magna Carta", "game theory", "the placebo effect", "urbanisation", "the ozone layer", "globalisation",
    "relativity", "cell division", "the scientific method", "interest rates", "a compiler", "the Enlightenment",
    "ocean currents", "photosynthesis versus respiration", "the Byzantine Empire", "solar panels", "memory in the brain",
    "the Great Depression", "linear regression", "sound waves", "the United Nations", "stoicism", "minimalism",
)
QUESTION_FORMS = (
    "What is {}?", "Explain {} in simple terms.", "Why is {} important?", "Give three key facts about {}.",
    "How would you explain {} to a ten-year-old?", "What are the advantages and disadvantages of {}?",
    "Describe the history of {}.", "What are common misconceptions about {}?", "How does {} work?",
    "Write a short lesson plan about {}.", "Compare {} with something from everyday life.",
    "What would a university exam question on {} look like? Answer it too.",
)
ROLES = (
    "a pirate captain", "a medieval knight", "a friendly librarian", "a sports coach", "a famous chef",
    "a tour guide in Rome", "a job interviewer", "a detective", "a spaceship pilot", "a kindergarten teacher",
    "a grumpy wizard", "a museum curator", "a personal trainer", "a customer support agent", "a news anchor",
    "a travel agent", "a park ranger", "a fortune teller", "a startup founder", "a marine biologist",
)
SITUATIONS = (
    "Describe your typical day.", "Give me advice on starting out in your line of work.",
    "Tell me about the hardest moment of your career.", "Answer my question: what do you enjoy most?",
    "Introduce yourself to a new group of people.", "Convince me to join your team.",
    "Explain a mistake you once made and what you learned.", "Describe your plans for next year.",
)
CODE_TASKS = (
    "reverses a string", "checks whether a number is prime", "computes the Fibonacci sequence",
    "merges two sorted lists", "counts word frequencies in a text", "finds the longest common prefix",
    "implements binary search", "removes duplicates from a list while keeping order",
    "parses a CSV file and sums a column", "validates an email address with a regular expression",
    "computes the factorial of n recursively", "flattens a nested list", "implements a stack class",
    "converts Celsius to Fahrenheit", "finds the second largest number in a list",
    "checks whether a string is a palindrome", "computes the greatest common divisor",
    "rotates a matrix by 90 degrees", "finds all anagrams of a word in a list", "implements a queue with two stacks",
    "counts the vowels in a sentence", "reads a JSON file and prints its keys", "computes a moving average",
    "finds the most common element in a list", "implements bubble sort", "checks balanced parentheses",
    "converts a number to Roman numerals", "returns the n largest items of a list", "implements an LRU cache",
)
LANGUAGES = ("Python", "Python", "Python", "JavaScript", "C", "Java", "Go", "Rust", "SQL", "C++")
PEOPLE = ("Maria", "Tom", "Aisha", "Kenji", "Lucas", "Sofia", "Omar", "Emma", "Raj", "Chloe", "Daniel", "Lena",
          "Carlos", "Mei", "Noah", "Fatima", "Ivan", "Grace", "Samuel", "Yuki")
ITEMS = ("apples", "pencils", "books", "stickers", "cookies", "marbles", "tickets", "cupcakes", "stamps", "shirts",
         "plants", "notebooks", "eggs", "toy cars", "bottles of water")
COUNTRIES = ("France", "Japan", "Brazil", "Canada", "Egypt", "India", "Kenya", "Mexico", "Norway", "Australia",
             "Italy", "Peru", "Vietnam", "Germany", "Argentina", "Turkey", "Spain", "Indonesia", "Chile", "Greece")
FACT_QUESTIONS = (
    "What is the capital of {c}?", "What languages are spoken in {c}?", "What is {c} famous for?",
    "Describe the climate of {c}.", "What are the main exports of {c}?", "Name a famous landmark in {c}.",
)
PEOPLE_FAMOUS = (
    "Marie Curie", "Albert Einstein", "Isaac Newton", "Ada Lovelace", "Leonardo da Vinci", "William Shakespeare",
    "Nelson Mandela", "Charles Darwin", "Galileo Galilei", "Alan Turing", "Cleopatra", "Mahatma Gandhi",
    "Frida Kahlo", "Ludwig van Beethoven", "Nikola Tesla", "Jane Austen", "Confucius", "Rosalind Franklin",
)
PERSON_QUESTIONS = ("Who was {p}?", "What is {p} best known for?", "Why is {p} still important today?",
                    "Write a short biography of {p}.", "What can students learn from {p}?")
# German sentences are composed subject + predicate (3rd person singular) + time; all combinations are grammatical.
GERMAN_SUBJECTS = (
    "Der Lehrer", "Die Ärztin", "Mein Bruder", "Unsere Nachbarin", "Der alte Mann", "Das Kind", "Die Managerin",
    "Der Bürgermeister", "Meine Großmutter", "Der Student", "Die Journalistin", "Ein Tourist", "Die Polizistin",
    "Der Koch", "Die Regierung", "Das Unternehmen", "Die Mannschaft", "Der Wissenschaftler", "Meine Freundin",
)
GERMAN_PREDICATES = (
    "liest ein spannendes Buch", "kauft frisches Brot auf dem Markt", "fährt mit dem Zug nach Hamburg",
    "schreibt einen langen Brief", "besucht das Museum in der Stadt", "arbeitet an einem neuen Projekt",
    "trinkt einen Kaffee im Café", "spricht mit den Journalisten", "plant eine Reise nach Italien",
    "repariert das alte Fahrrad", "kocht ein Abendessen für die Familie", "sucht eine neue Wohnung",
    "lernt seit Monaten Spanisch", "hilft den Kindern bei den Hausaufgaben", "erklärt die neuen Regeln",
    "kritisiert die Entscheidung scharf", "gewinnt überraschend den Wettbewerb", "spaziert durch den Park",
    "veröffentlicht einen Bericht über den Klimawandel", "baut ein kleines Haus am See",
    "fordert mehr Geld für die Schulen", "verliert den Schlüssel zum Büro", "wartet auf den letzten Bus",
)
GERMAN_TIMES = ("heute", "am Montag", "jeden Morgen", "seit einer Woche", "im Sommer", "am Wochenende",
                "nach der Arbeit", "trotz des Regens", "zum ersten Mal", "gestern Abend", "im nächsten Jahr")
