#!/usr/bin/env python3
"""make_unicode_newer.py: writes lua/loom/text/unicode_newer.lua, where the
Unicode tables of HF tokenizers and of loom's libraries differ:

categories: the general categories that HF's Oniguruma (Unicode 16.0) gives
  the code points assigned after Unicode 14.0 (Debian 12's PCRE2 10.42, for
  which they are unassigned, Cn). loom.text.onig adds these ranges to a
  regex's \\p{..} classes when a text holds such a character. Read from
  Oniguruma itself, through `tokenizers` (a Split pre-tokenizer per category
  over every such code point; the code points from Python's unicodedata,
  which must be Unicode 14.0, Python 3.11, as PCRE2's).
nfc_isolate: the code points that HF's NFC (older tables, about Unicode 9)
  does not reorder or compose but utf8proc (Unicode 15.0) does, plus U+11A7
  (utf8proc 2.8 composes it into a Hangul syllable, dropping it). Found by
  comparing both on probe strings around every code point; loom.text.unicode
  normalizes each of them alone, as HF in effect does.

    /opt/hfenv/bin/python scripts/make_unicode_newer.py     # about 2 minutes (needs libutf8proc2)
"""
import ctypes
import os
import unicodedata

import tokenizers
from tokenizers import Regex, pre_tokenizers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "lua", "loom", "text", "unicode_newer.lua")
CATEGORIES = "Lu Ll Lt Lm Lo Mn Mc Me Nd Nl No Pc Pd Ps Pe Pi Pf Po Sm Sc Sk So Zs Zl Zp Cc Cf Co".split()


def ranges(cps):
    out = []
    for c in cps:
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def utf8proc_nfc():
    u = ctypes.CDLL("libutf8proc.so.2")
    u.utf8proc_NFC.restype, u.utf8proc_NFC.argtypes = ctypes.c_void_p, [ctypes.c_char_p]
    libc = ctypes.CDLL("libc.so.6")
    libc.free.argtypes = [ctypes.c_void_p]

    def nfc(s):
        p = u.utf8proc_NFC(s.encode())
        out = ctypes.string_at(p).decode()
        libc.free(p)
        return out
    return nfc


def nfc_isolate():
    from tokenizers import normalizers
    hf, nfc = normalizers.NFC(), utf8proc_nfc()
    out = []
    for cp in range(1, 0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        probes = ["a\u0301" + c, "a" + c + "\u0301", "a\u05b0" + c + "x", "a" + c + "\u05b0", c + "\u0300\u0316",
                  "\u1100\u1161" + c, "e" + c + "\u0301", "\U00011935" + c]
        if any(hf.normalize_str(p) != nfc(p) for p in probes):
            out.append(cp)
    return out


def main():
    assert unicodedata.unidata_version == "14.0.0", "needs Python's Unicode 14.0 (PCRE2 10.42's): Python 3.11"
    cands = [cp for cp in range(0x110000) if not 0xD800 <= cp < 0xE000 and unicodedata.category(chr(cp)) == "Cn"]
    text = "".join(chr(c) for c in cands)
    lines = ["  categories = {"]
    for cat in CATEGORIES:
        kept = pre_tokenizers.Split(Regex(r"\p{%s}" % cat), behavior="removed").pre_tokenize_str(text)
        outside = set()
        for _, (a, b) in kept:   # offsets in characters: the code points that are not of cat
            outside.update(range(a, b))
        members = [cands[i] for i in range(len(cands)) if i not in outside]
        if members:
            body = ", ".join("{ 0x%X, 0x%X }" % (a, b) for a, b in ranges(members))
            lines.append("    %s = { %s }," % (cat, body))
            print(cat, len(members))
    iso = nfc_isolate()
    print("nfc_isolate", len(iso))
    lines.append("  },")
    lines.append("  nfc_isolate = { %s }," % ", ".join("{ 0x%X, 0x%X }" % (a, b) for a, b in ranges(iso)))
    with open(OUT, "w", encoding="utf-8") as f:
        f.write("-- unicode_newer.lua: written by scripts/make_unicode_newer.py (do not edit) from HF tokenizers %s:\n"
                % tokenizers.__version__)
        f.write("-- categories: the general category Oniguruma gives each code point assigned after Unicode 14.0\n"
                "-- (unassigned in PCRE2 10.42), as ranges {first, last}; loom.text.onig adds them to \\p{..} classes.\n"
                "-- nfc_isolate: the code points HF's NFC leaves alone and utf8proc's does not; loom.text.unicode\n"
                "-- normalizes each alone.\n")
        f.write("return {\n" + "\n".join(lines) + "\n}\n")


if __name__ == "__main__":
    main()
