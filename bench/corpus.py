"""Realistic text for generated stores: chat phrases, real English words, names, numbers, and
what chat text has beyond ASCII.

The words come from the docstrings of Python's standard library (thousands of real English words,
the same on every machine with the same Python), drawn with Zipf-like weights so common words are
common and rare ones rare, as in real text.

Chat text is not ASCII: names carry accents or are written in other scripts, customers write in
their own languages, and many messages carry an emoji (most of them 4 bytes in UTF-8, outside
the Basic Multilingual Plane). Stores built before the twelfth session had none of it, which hid a
cost that only such text has (bench/HISTORY.md, twelfth session). Since then about a third of
the names and a quarter of the stock phrases are beyond ASCII, and about a quarter of the
messages end with an emoji.
"""

from __future__ import annotations

import importlib
import itertools
import random
import re
import warnings
from functools import cache

PHRASES = (
    "Hi, where is my order?",
    "Hello! Can I change the delivery address?",
    "Thanks a lot, that helps.",
    "The package arrived damaged, what can I do?",
    "Is this still available in blue?",
    "I would like to return the shoes I bought last week.",
    "When do you open tomorrow?",
    "My payment failed twice, can you check?",
    "Please send me the invoice for order",
    "Do you ship to Austria and Switzerland?",
    "Your courier did not ring the bell.",
    "Can I book an appointment for Friday afternoon?",
    "The discount code does not work at checkout.",
    "Great service, thank you!",
    "I have not received the confirmation email.",
    "How long does the refund take?",
    "Could you call me back later today?",
    "The size chart says medium but it is too small.",
    "Is there a warranty on this model?",
    "We are on our way, see you in ten minutes.",
    "Our team will get back to you shortly.",
    "Your order has been shipped and should arrive on Monday.",
    "Sorry for the delay, the parcel is with the carrier now.",
    "Please share a photo of the damage so we can help.",
    "We have refunded the amount to your card.",
    "¿Dónde está mi pedido?",
    "Danke schön, bis morgen!",
    "Können Sie mir bitte die Rechnung schicken?",
    "Obrigado pela ajuda, até amanhã.",
    "Merci beaucoup, à bientôt !",
    "Il pacco è arrivato, grazie mille.",
    "Çok teşekkürler, iyi günler.",
    "Dziękuję, przesyłka dotarła.",
    "Спасибо, всё получил.",
    "ありがとうございます。",
)
EMOJI = ("🙂", "👍", "🙏", "😊", "😂", "❤️", "🎉", "📦", "🚚", "👍🏽", "😅", "🤔")
FIRST = [
    "Ada",
    "Grace",
    "Alan",
    "Linus",
    "Marta",
    "Jonas",
    "Lea",
    "Noah",
    "Emma",
    "Liam",
    "Olivia",
    "Mateo",
    "Sofia",
    "Lukas",
    "Mia",
    "Ben",
    "Hanna",
    "Paul",
    "Anna",
    "Felix",
    "Clara",
    "Leon",
    "Ida",
    "Finn",
    "Nora",
    "Elias",
    "Ella",
    "Jakob",
    "Lina",
    "Samuel",
    "Amira",
    "Yusuf",
    "Zoë",
    "Omar",
    "Priya",
    "Arjun",
    "Mei",
    "Chen",
    "Hiro",
    "Yuki",
    "Kofi",
    "Ama",
    "Diego",
    "Lucía",
    "Pablo",
    "Inés",
    "Tomasz",
    "Zofia",
    "Ivan",
    "Olga",
    "Sven",
    "José",
    "Björn",
    "Łukasz",
    "Çağla",
    "Ngọc",
    "Мария",
    "王芳",
    "محمد",
]
LAST = [
    "Lovelace",
    "Hopper",
    "Turing",
    "Torvalds",
    "Schulz",
    "Meyer",
    "Weber",
    "Fischer",
    "Wagner",
    "Becker",
    "Hoffmann",
    "Koch",
    "Richter",
    "Klein",
    "Wolf",
    "Neumann",
    "Schwarz",
    "Braun",
    "Zimmermann",
    "Hartmann",
    "Krüger",
    "Lange",
    "Werner",
    "Krause",
    "Lehmann",
    "Kaiser",
    "Fuchs",
    "Peters",
    "Scholz",
    "Garcia",
    "Rossi",
    "Dubois",
    "Novak",
    "Kowalski",
    "Nielsen",
    "Jensen",
    "Silva",
    "Santos",
    "Yilmaz",
    "Kaya",
    "Nakamura",
    "Sato",
    "Kim",
    "Park",
    "Okafor",
    "Mensah",
    "Haddad",
    "Cohen",
    "Levi",
    "Patel",
    "Singh",
    "Kumar",
    "Nguyễn",
    "Tran",
    "Müller",
    "Şahin",
    "Dvořák",
    "Jiménez",
    "Øvergård",
    "Иванова",
    "佐藤",
]


@cache
def words() -> tuple[str, ...]:
    found: set[str] = set()
    modules = [
        "os",
        "re",
        "json",
        "collections",
        "itertools",
        "functools",
        "datetime",
        "email",
        "http",
        "urllib",
        "sqlite3",
        "logging",
        "argparse",
        "pathlib",
        "subprocess",
        "threading",
        "asyncio",
        "decimal",
        "fractions",
        "statistics",
        "string",
        "textwrap",
        "unittest",
        "zipfile",
        "tarfile",
        "csv",
        "calendar",
        "random",
        "socket",
        "ssl",
        "hashlib",
        "shutil",
        "tempfile",
        "glob",
        "pickle",
        "copy",
        "pprint",
        "heapq",
        "bisect",
        "codecs",
        "locale",
        "uuid",
        "base64",
        "html",
        "io",
        "time",
        "math",
        "operator",
        "contextlib",
        "abc",
        "enum",
        "dataclasses",
        "inspect",
        "traceback",
        "warnings",
        "queue",
        "sched",
        "mailbox",
        "smtplib",
        "imaplib",
        "ftplib",
        "ipaddress",
        "cmd",
        "shlex",
        "doctest",
        "pdb",
        "timeit",
        "platform",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in modules:
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            for attr in dir(module):
                doc = getattr(getattr(module, attr, None), "__doc__", None)
                if isinstance(doc, str):
                    found.update(w.lower() for w in re.findall(r"\b[a-zA-Z]{3,12}\b", doc))
    return tuple(sorted(found))


class Text:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        vocabulary = list(words())
        rng.shuffle(vocabulary)
        self.vocabulary = vocabulary
        # Zipf-like: the k-th word is drawn with weight 1/k (cumulated once: drawing is O(log n)).
        self.cum_weights = list(itertools.accumulate(1 / (k + 1) for k in range(len(vocabulary))))

    def name(self) -> str:
        return f"{self.rng.choice(FIRST)} {self.rng.choice(LAST)}"

    def phone(self) -> str:
        country = self.rng.choice(("49", "43", "41", "44", "33", "39", "34", "1", "90", "48"))
        return country + "".join(self.rng.choice("0123456789") for _ in range(10))

    def message(self) -> str:
        text = self._message()
        if self.rng.random() < 0.25:
            text += " " + self.rng.choice(EMOJI)
        return text

    def _message(self) -> str:
        kind = self.rng.random()
        if kind < 0.45:
            text = self.rng.choice(PHRASES)
            if text.endswith("order"):
                text += f" {self.rng.randint(10000, 99999)}"
            return text
        n = self.rng.randint(3, 18)
        chosen = self.rng.choices(self.vocabulary, cum_weights=self.cum_weights, k=n)
        if kind > 0.9:
            chosen.insert(self.rng.randrange(n), str(self.rng.randint(100, 999999)))
        if kind > 0.95:
            chosen.insert(0, self.rng.choice(FIRST))
        return " ".join(chosen).capitalize() + self.rng.choice((".", "?", "!", ""))
