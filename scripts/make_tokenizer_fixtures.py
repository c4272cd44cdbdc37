#!/usr/bin/env python3
"""make_tokenizer_fixtures.py: trains small tokenizers with Hugging Face's
`tokenizers` and writes, under spec/fixtures/tokenizers/, each one's
tokenizer.json in the layout its model family publishes, and the ids HF
gives for a set of texts (ASCII, accented, CJK, RTL, emoji, code, combining
marks, zero-width joiners, digit runs, special-token strings inside text).
spec/tokenizer_spec.lua and spec/tokenizer_families_spec.lua check loom's
ids against them; loom never imports `tokenizers`. Nothing is downloaded:
the vocabularies are trained here on tinyshakespeare and the lines below.

    /opt/hfenv/bin/python scripts/make_tokenizer_fixtures.py

Kinds:
  gpt2       byte-level BPE, GPT-2's regex (ByteLevel use_regex)
  llama3     Llama 3: Split(its regex) + ByteLevel, ignore_merges, the
             <|begin_of_text|> template and its chat tokens
  llama2     Llama 2 / Mistral v0.1 (legacy): Prepend + Replace normalizer,
             BPE with byte fallback and fuse_unk, a <s> template
  metaspace  the Metaspace pre-tokenizer (split on "▁", prepend "first")
  qwen2      Qwen2/2.5 as transformers' Qwen2Converter writes it: NFC, the
             Qwen2 regex, continuing_subword_prefix "" and end_of_word_suffix
             "", Qwen2.5's added tokens (special and not)
  qwen3      the same layout with Qwen3's added tokens (<think>, <tool_response> ...)
  qwen35     Qwen3.5's regex ([\\p{L}\\p{M}]+, \\p{N}) in that layout
  olmo2      OLMo 2: cl100k's regex (\\p{N}{1,3}) + ByteLevel, <|endoftext|>, <|pad|>, chat tokens
  mistral    Mistral v0.3 (non-legacy LlamaConverter): Metaspace(prepend
             "first", split false), byte fallback, [INST] [/INST] tokens
  phi3       Phi-3: the Llama 2 layout with Phi-3's chat tokens (rstrip)
  gemma      Gemma: Replace(" " -> "▁"), Split(" ", MergedWithPrevious),
             byte fallback, <start_of_turn>/<end_of_turn>, user-defined tokens
  sentencepiece  transformers 5's layout for a SentencePiece model of no known
             family: Replace regexes (extra whitespace, the dummy prefix),
             Metaspace, a Split of the user-defined pieces, ignore_merges
Ids in <kind>.expected.json are HF's (0-based); loom's are one more. (The
SentencePiece-style vocabularies differ a little from run to run: HF's
trainer breaks ties of its limited alphabet in hash order; the ids are
HF's for the vocabulary written beside them.)
regex.expected.json: pieces of real tokenizers' regexes (Oniguruma, as HF
runs them) on the same texts, for loom's PCRE2 translation.
"""
import json
import os
import unicodedata

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "spec", "fixtures", "tokenizers")

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
O200K_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_REGEX = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                  r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

MULTI = ["Café déjà vu: naïve façade, Ærøskøbing, São Paulo, Zürich, señor.",
         "東京は日本の首都です。今日は良い天気ですね。中文测试，简体字。",
         "I ❤️ loom 🦀🚀 and tea ☕ with friends 👩‍👩‍👧 👍🏽.",
         "Ελληνικά και русский текст, Ölçü ve ğ, 한국어 텍스트입니다.",
         "مرحبا بالعالم، هذا نص عربي. שלום עולם, זה טקסט בעברית.",
         "नमस्ते दुनिया, यह हिंदी है। สวัสดีชาวโลก ภาษาไทย",
         "def main(argv):\n    for i in range(10):\n        print(f\"{i:>4}\", argv[i])  # loop\n",
         "if (x != 0 && y >= 1) { return a->b[i] << 2; } // C++",
         "The year 2026 had 365 days; pi = 3.14159265358979, 1,000,000 items."]

TEXTS = [
    "Hello world! This is a test of the tokenizer.",
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "I'm sure you're right; he'll say they'd go, it's DON'T and We'VE.",
    "Café déjà vu: naïve façade, Ærøskøbing, crème brûlée à la mode.",
    "東京は日本の首都です。中文测试，简体字と한국어 텍스트.",
    "Emoji: 🦀🚀 ❤️ 👩‍👩‍👧 🇫🇷 ☕☕ 😀! 👍🏽 and ❤︎",
    "   leading spaces\n\n\ttabs\t\tand    many   spaces  \r\n trailing   ",
    "\n\n\n",
    " ",
    "",
    "numbers 1234567 3.14159 and 2026-11-26, 100000 items",
    "<|endoftext|>special<|endoftext|> in the middle <tool>call</tool> here",
    "x" * 300 + " " + "ab" * 100,
    "a  <mask> b <mask>c \t<sep>  d<sep>\n e",
    # combining marks that NFC composes, and NFC's singletons (Å Ω K 豈)
    "Cafe\u0301 de\u0301ja\u0300 vu, A\u030angstro\u0308m, \u1100\u1161\u11a8 \u212b \u2126 \u212a \uf900",
    "e\u0301\u0301 o\u0308\u0304 \u0915\u093c \u0627\u0653 n\u0303 \uac00\u11a7 \u1100\u1161\u11a7\u11a8",
    # zero-width joiners and non-joiners, variation selectors, a BOM
    "\u200dzwj\u200d \u200c\u0646\u0645\u200c\u06cc\u200c\u062e\u0648\u0627\u0647\u0645 \ufeffbom \u2764\ufe0f\u200d\U0001f525",
    # long digit runs, Arabic-Indic and fullwidth digits
    "1234567890123456789012345678901234567890 \u0661\u0662\u0663\u0664\u0665 \uff11\uff12\uff13 1,234.5e-10",
    # special-token strings inside text, whole and broken
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|><|im_start|>assistant\n",
    "<|im_start <|im_end|x <|endoftext <think>ok</think> <tool_call>{\"a\": 1}</tool_call>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
    "[INST] What is 2+2? [/INST] 4</s>[INST]x[/INST]",
    "<|user|>\nHi there<|end|>\n<|assistant|>  Hello!<|end|><|endoftext|>",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n<table>x</table>\t\t<b>",
    # right-to-left text with marks, Devanagari and Thai
    "\u202bمرحبا بالعالم\u202c \u200fשלום עולם\u200f (RTL) נ\u05b8א",
    "नमस्ते दुनिया क्षत्रिय, สวัสดีครับ ภาษาไทย",
    # whitespace of other kinds: NEL, NBSP, ideographic space, line separator
    "a\u0085b\u00a0c\u3000d\u2028e\u2029f\u000bg\u000ch \u180e i",
    # case-insensitive contractions with folded characters (ſ, K), Turkish I
    "IT'S it'ſ DON'T we'RE i'M she'LL İstanbul ıi 'K 'k",
    "def f(x):\n\treturn x**2  # square\n\n\nclass A:\n    pass\r\n",
    "https://example.com/path?q=1&r=2#frag user@mail.org ~/dir/file.txt",
    "a\tb\u00adc\u2060d\U0001f1e8\U0001f1f3\U0001f3f3\ufe0f\u200d\U0001f308",
    # letters, digits and marks Unicode assigned after 14.0 (PCRE2 10.42's tables; HF's Oniguruma has 16.0):
    # CJK Extension H, Kawi, Garay, Cyrillic modifier letters, new emoji; Dives Akuru's composition (13.0)
    "x\U00031350\U00031351y \U00011F04\U00011F05\U00011F50\U00011F51 \U00010D50\U00010D70 \U0001E030's "
    "\U0001FAE8\U0001FA77 12\U00011F52 \U00011935\U00011930 a\u0CF3b",
    # marks that HF's NFC tables (about Unicode 9) do not reorder and utf8proc's (15.0) do
    "a\u0301\u0c3c b\u1df6\u0301 \U00011910\U0001193e\U00011943 \u0d15\u0301\u0d3b",
]

# Qwen2.5's added tokens (ids after the vocabulary), special or not, as published
QWEN25_ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
                ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
                ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
                ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
                ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False),
                ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False)]
QWEN3_ADDED = QWEN25_ADDED + [("<tool_response>", False), ("</tool_response>", False), ("<think>", False),
                              ("</think>", False)]


def corpus():
    with open(os.path.join(ROOT, "examples", "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
        text = f.read()[:300000]
    return text.split("\n") + MULTI * 40


def byte_level_bpe(regex, vocab_size, nfc=False, ignore_merges=False):
    """a byte-level BPE trained with the family's regex (its vocab and merges)"""
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tr = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False)
    tok.train_from_iterator(corpus(), tr)
    return tok


def added(tok, specs):
    tok.add_special_tokens([AddedToken(c, special=True, normalized=False) for c, s in specs if s])
    tok.add_tokens([AddedToken(c, special=False, normalized=False) for c, s in specs if not s])


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
    tok = byte_level_bpe(LLAMA3_REGEX, 800, ignore_merges=True)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>", "<|endoftext|>"]
    added(tok, [(s, True) for s in specials])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    tok.add_tokens(["<tool>", "</tool>"])
    return tok


def qwen(added_specs, regex=QWEN2_REGEX):
    """transformers' Qwen2Converter layout (NFC, the regex, empty prefix and
    suffix) over a vocabulary trained here"""
    from transformers.convert_slow_tokenizer import Qwen2Converter
    trained = json.loads(byte_level_bpe(regex, 900, nfc=True).to_str())
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["model"]["merges"]]

    class Original:   # what the converter reads of a slow tokenizer
        add_prefix_space = False
    conv = Qwen2Converter.__new__(Qwen2Converter)
    conv.original_tokenizer = Original()
    tok = conv.converted(vocab=trained["model"]["vocab"], merges=merges)
    if regex != QWEN2_REGEX:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    added(tok, added_specs)
    return tok


def olmo2():
    tok = byte_level_bpe(LLAMA3_REGEX, 800)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    added(tok, [("<|endoftext|>", True), ("<|fim_prefix|>", True), ("<|fim_middle|>", True),
                ("<|fim_suffix|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|pad|>", True)])
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
    for a in j["added_tokens"]:
        a["id"] = new[a["content"]]
    return Tokenizer.from_str(json.dumps(j))


def sp_bpe(normalizer, pre_tokenizer, specials, vocab_size=600):
    """a SentencePiece-style BPE (characters, byte fallback, unk) trained here"""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tr = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, limit_alphabet=150,
                             show_progress=False)
    tok.train_from_iterator(corpus(), tr)
    return with_byte_tokens(tok, len(specials))


def llama_decoder(strip):
    seq = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    return decoders.Sequence(seq + ([decoders.Strip(" ", 1, 0)] if strip else []))


def llama2():
    tok = sp_bpe(normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]), None,
                 ["<unk>", "<s>", "</s>"])
    tok.decoder = llama_decoder(True)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    return tok


def metaspace():
    tok = sp_bpe(None, pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True),
                 ["<unk>", "<s>", "</s>"])
    tok.decoder = decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="first", split=True),
                                     decoders.ByteFallback(), decoders.Fuse()])
    return tok


def mistral():
    tok = sp_bpe(None, pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False),
                 ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]"])
    tok.decoder = llama_decoder(True)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    added(tok, [("<unk>", True), ("<s>", True), ("</s>", True), ("[INST]", True), ("[/INST]", True),
                ("[TOOL_CALLS]", True)])
    return tok


def phi3():
    tok = sp_bpe(normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]), None,
                 ["<unk>", "<s>", "</s>"])
    tok.decoder = llama_decoder(True)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    tok.add_special_tokens([AddedToken(c, special=True, normalized=False) for c in ("<unk>", "<s>", "</s>")])
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    tok.add_special_tokens([AddedToken(c, special=True, normalized=False, rstrip=True)
                            for c in ("<|assistant|>", "<|placeholder1|>", "<|system|>", "<|end|>", "<|user|>")])
    tok.add_tokens([AddedToken("<tool>", special=False, normalized=True)])   # a normalized one: matched as "▁<tool>"
    return tok


def gemma():
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    tok = sp_bpe(normalizers.Replace(" ", "▁"), pre_tokenizers.Split(" ", "merged_with_previous"), specials)
    tok.decoder = llama_decoder(False)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", 2)])
    added(tok, [(s, True) for s in specials])
    tok.add_tokens([AddedToken(c, special=False, normalized=False) for c in ("<table>", "</table>", "\t\t", "<b>")])
    return tok


def sentencepiece():
    """transformers 5's SpmConverter.build_tokenizer_from_spm_proto layout (a SentencePiece
    model with user-defined pieces, remove_extra_whitespaces, legacy): Replace regexes in
    the normalizer, Metaspace + a Split of the user-defined pieces, ignore_merges"""
    import re
    tok = sp_bpe(None, None, ["<unk>", "<s>", "</s>"])
    j = json.loads(tok.to_str())
    user_defined = ["<table>", "\t\t", "▁▁", "#1"]
    j["model"]["ignore_merges"] = True
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Replace", "pattern": {"Regex": r"\A +| +\z"}, "content": ""},
        {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        {"type": "Replace", "pattern": {"Regex": "\\A▁"}, "content": "▁▁"}]}
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": False},
        {"type": "Split", "pattern": {"Regex": "|".join(re.escape(p) for p in sorted(user_defined, key=len, reverse=True))},
         "behavior": "Isolated", "invert": False}]}
    tok = Tokenizer.from_str(json.dumps(j))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return tok


REGEXES = {"gpt2": GPT2_REGEX, "llama3": LLAMA3_REGEX, "qwen2": QWEN2_REGEX, "qwen35": QWEN35_REGEX,
           "o200k": O200K_REGEX, "deepseek": DEEPSEEK_REGEX, "digits": r"\p{N}{1,3}",
           "spm_user_defined": "|".join(__import__("re").escape(p) for p in ["<table>", "\t\t", "▁▁", "#1"]),
           "spm_spaces": r"\A +| +\z", "runs": r" {2,}", "lines": r"^\s*\S+$"}


def regex_cases():
    out = []
    for name, rx in REGEXES.items():
        for behavior in ["isolated", "removed", "merged_with_previous", "merged_with_next", "contiguous"]:
            for invert in ([False, True] if behavior == "removed" else [False]):
                if behavior != "isolated" and name not in ("llama3", "spm_spaces", "runs"):
                    continue
                pt = pre_tokenizers.Split(Regex(rx), behavior=behavior, invert=invert)
                pieces = [[p for p, _ in pt.pre_tokenize_str(t)] for t in TEXTS]
                out.append({"name": name, "regex": rx, "behavior": behavior, "invert": invert, "pieces": pieces})
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    kinds = [("gpt2", gpt2), ("llama3", llama3), ("llama2", llama2), ("metaspace", metaspace),
             ("qwen2", lambda: qwen(QWEN25_ADDED[:3])), ("qwen3", lambda: qwen(QWEN3_ADDED)),
             ("qwen35", lambda: qwen(QWEN3_ADDED[:3], QWEN35_REGEX)), ("olmo2", olmo2), ("mistral", mistral),
             ("phi3", phi3), ("gemma", gemma), ("sentencepiece", sentencepiece)]
    for name, make in kinds:
        tok = make()
        tok.save(os.path.join(OUT, name + ".json"), pretty=False)
        cases = []
        for text in TEXTS:
            enc = tok.encode(text)
            cases.append({"text": text, "ids": enc.ids,
                          "decoded": tok.decode(enc.ids, skip_special_tokens=True),
                          "decoded_special": tok.decode(enc.ids, skip_special_tokens=False)})
        pad = tok.get_vocab_size()   # an id no text makes, so padding shows
        tok.enable_padding(pad_id=0, pad_token="<pad>")
        batch = tok.encode_batch(TEXTS[:4])
        expected = {"tokenizers": tokenizers.__version__, "cases": cases,
                    "batch": {"texts": TEXTS[:4], "pad_id": 0, "ids": [e.ids for e in batch],
                              "attention_mask": [e.attention_mask for e in batch]}}
        with open(os.path.join(OUT, name + ".expected.json"), "w", encoding="utf-8") as f:
            json.dump(expected, f, ensure_ascii=False, indent=0)
        print(name, tok.get_vocab_size(), "tokens;", sum(len(c["ids"]) for c in cases), "ids;", pad)
    with open(os.path.join(OUT, "regex.expected.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers": tokenizers.__version__, "texts": TEXTS, "cases": regex_cases()}, f,
                  ensure_ascii=False, indent=0)
    assert unicodedata.normalize("NFC", "e\u0301") == "\u00e9"


if __name__ == "__main__":
    main()
