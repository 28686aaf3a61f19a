#!/usr/bin/python3
"""Writes configs/tokenizers/agent_calc.json: a small byte-level BPE for the
calculator agent (configs/agent_calc.yaml).

One token per byte (so any text encodes), ChatML's <|endoftext|>,
<|im_start|> and <|im_end|>, and merges learned from the texts the agent
sees and writes: the system prompt with the calculator tool (as relay renders
it), questions, tool calls, tool results and answers. Digits stay one token
each (a Digits pre-tokenizer with individual_digits), so numbers are copied
digit by digit, never as learned chunks. With byte tokens alone a prompt is
704 tokens; with the merges it is a fraction of that, which is what makes
the agent train in minutes on two cores.

    /usr/bin/python3 scripts/tokenizers/make_agent_calc.py [--merges N] [--out PATH]

Deterministic: the same arguments write the same file.
"""

import argparse
import collections
import json
import os
import random

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# The calculator tool's system message as relay renders it
# (env::tools_system_content with env::calculator_schema).
SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "calculator", "description": "Evaluates an '
    'integer expression with + - * and parentheses.", "parameters": {"type": "object", '
    '"properties": {"expression": {"type": "string", "description": "for example (12 + 3) * '
    '7"}}, "required": ["expression"]}}}\n</tools>\n\nFor each function call, return a json '
    "object with function name and arguments within <tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def corpus(rng, n):
    """Texts of n episodes, specials left in (they are split off first)."""
    for _ in range(n):
        ops = rng.choice(["+", "-", "*"])
        expr = f"{rng.randint(0, 999)}{ops}{rng.randint(0, 999)}"
        result = str(eval(expr))  # noqa: S307 (digits and one operator)
        yield (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nWhat is {expr}?"
               f"<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{{\"name\": \"calculator\", "
               f"\"arguments\": {{\"expression\": \"{expr}\"}}}}\n</tool_call><|im_end|>\n"
               f"<|im_start|>user\n<tool_response>\n{result}\n</tool_response><|im_end|>\n"
               f"<|im_start|>assistant\n{result}<|im_end|>")


def byte_symbols():
    """GPT-2's byte -> unicode table."""
    printable = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    table, n = {}, 256
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(n)
            n += 1
    return table


def words(text):
    """Pre-tokenization: specials split off, then every digit alone, the rest
    of each run one word (ByteLevel without its regex)."""
    for special in SPECIALS:
        text = text.replace(special, "\0")
    for piece in text.split("\0"):
        run = ""
        for c in piece:
            if c.isdigit():
                if run:
                    yield run
                    run = ""
                yield c
            else:
                run += c
        if run:
            yield run


def train(texts, merges_wanted):
    table = byte_symbols()
    counts = collections.Counter()
    for t in texts:
        for w in words(t):
            counts[tuple(table[b] for b in w.encode())] += 1
    merges = []
    vocab = collections.Counter(counts)
    for _ in range(merges_wanted):
        pairs = collections.Counter()
        for w, c in vocab.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        if pairs[best] < 2:
            break
        merges.append(best)
        joined = best[0] + best[1]
        nxt = collections.Counter()
        for w, c in vocab.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            nxt[tuple(out)] += c
        vocab = nxt
    return table, merges


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--merges", type=int, default=400)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "configs",
                                                 "tokenizers", "agent_calc.json"))
    a = p.parse_args()
    table, merges = train(list(corpus(random.Random(0), 200)), a.merges)
    vocab = {table[b]: b for b in range(256)}
    for i, s in enumerate(SPECIALS):
        vocab_id = 256 + i
        assert s not in vocab
    next_id = 256 + len(SPECIALS)
    for a_, b_ in merges:
        vocab[a_ + b_] = next_id
        next_id += 1
    tok = {
        "version": "1.0",
        "added_tokens": [{"id": 256 + i, "content": s, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, s in enumerate(SPECIALS)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [f"{x} {y}" for x, y in merges]},
    }
    with open(a.out, "w") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {a.out}: {next_id} tokens ({len(merges)} merges)")


if __name__ == "__main__":
    main()
