#!/usr/bin/env python3
"""make_tokenizer_fixtures.py: trains small tokenizers with Hugging Face's
`tokenizers` (PyPI) and writes, under spec/fixtures/tokenizers/, each one's
tokenizer.json and the ids HF gives for a set of texts (ASCII, accented,
CJK, emoji, whitespace-heavy, added tokens). spec/tokenizer_spec.lua checks
loom's ids against them; loom never imports `tokenizers`.

    pip install --break-system-packages tokenizers
    python3 scripts/make_tokenizer_fixtures.py

Kinds: gpt2 (byte-level BPE, GPT-2's regex), llama3 (Llama 3's Split regex
then byte-level, ignore_merges, a <|begin_of_text|> template), llama2
(SentencePiece style: Prepend + Replace normalizer, BPE with byte fallback,
a <s> template) and metaspace (the Metaspace pre-tokenizer, split on "▁").
Ids in <kind>.expected.json are HF's (0-based); loom's are one more.
"""
import json
import os

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "spec", "fixtures", "tokenizers")
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

MULTI = ["Café déjà vu: naïve façade, Ærøskøbing, São Paulo, Zürich, señor.",
         "東京は日本の首都です。今日は良い天気ですね。",
         "I ❤️ loom 🦀🚀 and tea ☕ with friends 👩‍👩‍👧.",
         "Ελληνικά και русский текст, Ölçü ve ğ."]

TEXTS = [
    "Hello world! This is a test of the tokenizer.",
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "I'm sure you're right; he'll say they'd go, it's DON'T and We'VE.",
    "Café déjà vu: naïve façade, Ærøskøbing, crème brûlée à la mode.",
    "東京は日本の首都です。中文测试，简体字と한국어 텍스트.",
    "Emoji: 🦀🚀 ❤️ 👩‍👩‍👧 🇫🇷 ☕☕ 😀!",
    "   leading spaces\n\n\ttabs\t\tand    many   spaces  \r\n trailing   ",
    "\n\n\n",
    " ",
    "",
    "numbers 1234567 3.14159 and 2026-11-26, 100000 items",
    "<|endoftext|>special<|endoftext|> in the middle <tool>call</tool> here",
    "x" * 300 + " " + "ab" * 100,
    "a  <mask> b <mask>c \t<sep>  d<sep>\n e",
]


def corpus():
    with open(os.path.join(ROOT, "examples", "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
        text = f.read()[:300000]
    lines = text.split("\n")
    return lines + MULTI * 50


def gpt2():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tr = trainers.BpeTrainer(vocab_size=700, special_tokens=["<|endoftext|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), tr)
    tok.add_tokens(["<tool>", "</tool>"])
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=False, special=True),
                            AddedToken("<sep>", lstrip=False, rstrip=True, special=True)])
    return tok


def llama3():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|endoftext|>"]
    tr = trainers.BpeTrainer(vocab_size=800, special_tokens=specials,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), tr)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    tok.add_tokens(["<tool>", "</tool>"])
    return tok


def with_byte_tokens(tok, n_special):
    """SentencePiece vocabularies hold <0x00>..<0xFF> right after the special
    tokens; HF's trainer does not add them, so they are put in here."""
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    new = {}
    for t, i in vocab.items():
        new[t] = i if i < n_special else i + 256
    for b in range(256):
        new["<0x%02X>" % b] = n_special + b
    j["model"]["vocab"] = new
    return Tokenizer.from_str(json.dumps(j))


def llama2():
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tr = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=120,
                             show_progress=False)
    tok.train_from_iterator(corpus(), tr)
    tok = with_byte_tokens(tok, 3)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    return tok


def metaspace():
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tok.decoder = decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="first", split=True),
                                     decoders.ByteFallback(), decoders.Fuse()])
    tr = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=120,
                             show_progress=False)
    tok.train_from_iterator(corpus(), tr)
    return with_byte_tokens(tok, 3)


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, make in [("gpt2", gpt2), ("llama3", llama3), ("llama2", llama2), ("metaspace", metaspace)]:
        tok = make()
        tok.save(os.path.join(OUT, name + ".json"))
        cases = []
        for text in TEXTS:
            enc = tok.encode(text)
            cases.append({"text": text, "ids": enc.ids,
                          "decoded": tok.decode(enc.ids, skip_special_tokens=True),
                          "decoded_special": tok.decode(enc.ids, skip_special_tokens=False)})
        pad = tok.get_vocab_size()   # an id no text makes, so padding shows
        tok.enable_padding(pad_id=0, pad_token="<pad>")
        batch = tok.encode_batch(TEXTS[:4])
        expected = {"cases": cases, "batch": {"texts": TEXTS[:4], "pad_id": 0,
                                              "ids": [e.ids for e in batch],
                                              "attention_mask": [e.attention_mask for e in batch]}}
        with open(os.path.join(OUT, name + ".expected.json"), "w", encoding="utf-8") as f:
            json.dump(expected, f, ensure_ascii=False, indent=0)
        print(name, tok.get_vocab_size(), "tokens;", sum(len(c["ids"]) for c in cases), "ids")


if __name__ == "__main__":
    main()
