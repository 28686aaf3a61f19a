#!/usr/bin/python3
"""Plain-PyTorch reference for relay's benchmarks (docs/BENCHMARKS.md).

relay's decoder (llama and qwen2, as src/model/layers.cc and policy.cc
implement them) written the way a Hugging Face model is: nn.Modules under HF's
parameter names, RMSNorm in fp32, rotate-half RoPE with cos/sin from fp32
inv_freq, grouped-query attention by repeating K/V heads (transformers'
repeat_kv and eager attention), SwiGLU, q/k/v bias for qwen2, tied
embeddings. It loads the model directory relay writes (config.json +
model.safetensors) with a small safetensors reader, so both sides run the
same weights.

Two workloads, each timed inside this process (interpreter start-up and
model loading are not timed):

  decode  an HF-style `generate` loop: prefill the prompts, then one token per
          step with a KV cache grown by torch.cat (transformers'
          DynamicCache), sampling at temperature 1 by softmax + multinomial,
          under torch.inference_mode().
  train   one optimizer step on a batch of sequences: forward, log_softmax +
          gather of each response token's log-prob, relay's PPO clip loss
          (token-mean, dual clip 3, ratio clamp 20), backward, global
          grad-norm clip at 1, AdamW.

The model runs where `load` puts it: the CPU in fp32 by default, or a CUDA
device and bfloat16 (rollout_bench --device/--dtype); attention is eager
(transformers' "eager": matmul, fp32 softmax, matmul) or, on torch >= 2.0,
F.scaled_dot_product_attention (transformers' "sdpa", its default on GPUs).

Usage:
  relay_ref.py serve [--threads N] [--blas-threads T]
      JSON commands on stdin, one per line; one JSON reply per line on stdout
      (see Server). rollout_bench --python and trainer_bench drive this.
  relay_ref.py selfcheck
      Tests this file alone on a random tiny model: safetensors round trip,
      cached decoding against the full forward, and a training step.
"""

import argparse
import ctypes
import json
import math
import os
import struct
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn

# ---------------------------------------------------------------- safetensors

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
    "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
    "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def read_safetensors(path):
    """Every tensor of a safetensors file, by name, as owned CPU tensors."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES[e["dtype"]]
        begin, end = e["data_offsets"]
        shape = e["shape"]
        count = math.prod(shape)
        if count == 0:
            out[name] = torch.empty(shape, dtype=dtype)
            continue
        t = torch.frombuffer(data, dtype=dtype, count=count, offset=base + begin)
        if (end - begin) != t.numel() * t.element_size():
            raise ValueError(f"{path}: {name}: {end - begin} bytes for shape {shape}")
        out[name] = t.reshape(shape).clone()  # own, aligned storage
    return out


def write_safetensors(path, tensors):
    """Writes {name: tensor} (the self-check's fixtures)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        b = ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------- the model


class Config:
    def __init__(self, d):
        self.model_type = d.get("model_type", "llama")
        self.vocab_size = d["vocab_size"]
        self.hidden_size = d["hidden_size"]
        self.intermediate_size = d["intermediate_size"]
        self.num_hidden_layers = d["num_hidden_layers"]
        self.num_attention_heads = d["num_attention_heads"]
        self.num_key_value_heads = d.get("num_key_value_heads", self.num_attention_heads)
        self.head_dim = d.get("head_dim") or self.hidden_size // self.num_attention_heads
        self.rms_norm_eps = d.get("rms_norm_eps", 1e-6)
        self.rope_theta = d.get("rope_theta", 10000.0)
        self.tie_word_embeddings = d.get("tie_word_embeddings", False)
        # relay: q/k/v bias when attention_bias or qwen2 (Qwen2 always has it).
        self.qkv_bias = bool(d.get("attention_bias", False)) or self.model_type == "qwen2"


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.to(torch.float32)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h, self.kvh, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.sdpa = False  # set by CausalLM.set_attention
        self.q_proj = nn.Linear(c.hidden_size, self.h * self.d, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden_size, self.kvh * self.d, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden_size, self.kvh * self.d, bias=c.qkv_bias)
        self.o_proj = nn.Linear(self.h * self.d, c.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask, past):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kvh, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kvh, self.d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if past is not None:  # DynamicCache: grow by concatenation
            if past[0] is not None:
                k = torch.cat((past[0], k), dim=2)
                v = torch.cat((past[1], v), dim=2)
            past[0], past[1] = k, v
        rep = self.h // self.kvh
        if rep > 1:  # repeat_kv
            S = k.shape[2]
            k = k[:, :, None].expand(B, self.kvh, rep, S, self.d).reshape(B, self.h, S, self.d)
            v = v[:, :, None].expand(B, self.kvh, rep, S, self.d).reshape(B, self.h, S, self.d)
        if self.sdpa:
            # transformers' sdpa path: no mask when it is plain causal (a
            # prefill from position 0), is_causal then; the mask otherwise.
            plain = T > 1 and k.shape[2] == T
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if plain else mask,
                                                 is_causal=plain)
        else:
            scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.d)
            if mask is not None:
                scores = scores + mask
            probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(probs, v)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.h * self.d))


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = Mlp(c)

    def forward(self, x, cos, sin, mask, past):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, past)
        return h + self.mlp(self.post_attention_layernorm(h))


class Decoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class CausalLM(nn.Module):
    """model.* and (untied) lm_head.weight, as in transformers."""

    def __init__(self, c):
        super().__init__()
        self.config = c
        self.model = Decoder(c)
        self.lm_head = None
        if not c.tie_word_embeddings:
            self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        exponent = torch.arange(0, c.head_dim, 2, dtype=torch.int64).float() / c.head_dim
        # fp32 wherever the model goes (transformers keeps it fp32 too); not
        # in the state dict.
        self.register_buffer("inv_freq", 1.0 / (c.rope_theta ** exponent), persistent=False)

    def to_device(self, device, dtype):
        """Parameters to `device` in `dtype`; inv_freq stays fp32."""
        self.to(device=device, dtype=dtype)
        self.inv_freq = self.inv_freq.float()
        return self

    def set_attention(self, kind):
        if kind not in ("eager", "sdpa"):
            raise ValueError(f"attention {kind!r}: eager or sdpa")
        if kind == "sdpa" and not hasattr(F, "scaled_dot_product_attention"):
            raise ValueError(f"attention sdpa needs torch >= 2.0 (this is {torch.__version__})")
        for layer in self.model.layers:
            layer.self_attn.sdpa = kind == "sdpa"

    def head_weight(self):
        return self.lm_head.weight if self.lm_head is not None else self.model.embed_tokens.weight

    def hidden(self, input_ids, past=None):
        """Final hidden states [B, T, H]. `past`: a list of [k, v] per layer
        (None entries at the start), extended in place; positions continue
        from the cached length."""
        B, T = input_ids.shape
        past_len = 0
        if past is not None and past[0][0] is not None:
            past_len = past[0][0].shape[2]
        dev = input_ids.device
        x = self.model.embed_tokens(input_ids)
        pos = torch.arange(past_len, past_len + T, dtype=torch.float32, device=dev)
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        # computed in fp32, then in the activations' dtype (as transformers)
        cos = emb.cos()[None, None].to(x.dtype)  # [1, 1, T, D]
        sin = emb.sin()[None, None].to(x.dtype)
        mask = None
        if T > 1:  # causal over the new positions; every cached key is visible
            mask = torch.full((T, T + past_len), float("-inf"), dtype=x.dtype,
                              device=dev).triu(past_len + 1)[None, None]
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, mask, past[i] if past is not None else None)
        return self.model.norm(x)

    def forward(self, input_ids):
        return F.linear(self.hidden(input_ids), self.head_weight())


DEVICE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_model(model_dir, device="cpu", dtype="float32", attention="eager"):
    """The directory's model on `device` in `dtype` (float32 or bfloat16)."""
    if dtype not in DEVICE_DTYPES:
        raise ValueError(f"dtype {dtype!r}: float32 or bfloat16")
    with open(os.path.join(model_dir, "config.json")) as f:
        config = Config(json.load(f))
    tensors = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    model = CausalLM(config)
    model.load_state_dict(tensors, strict=True)
    model.set_attention(attention)
    model.to_device(torch.device(device), DEVICE_DTYPES[dtype])
    model.eval()
    return model


def model_device(model):
    return model.model.embed_tokens.weight.device


# ---------------------------------------------------------------- workloads


def generate(model, prompts, new_tokens, generator):
    """HF-style sampling loop; returns (seconds, tokens [B, new_tokens])."""
    with torch.inference_mode():
        start = time.perf_counter()
        input_ids = torch.tensor(prompts, dtype=torch.int64, device=model_device(model))
        past = [[None, None] for _ in model.model.layers]
        step_ids = input_ids
        for _ in range(new_tokens):
            h = model.hidden(step_ids, past)
            logits = F.linear(h[:, -1, :], model.head_weight()).float()
            probs = F.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs, num_samples=1, generator=generator)
            input_ids = torch.cat((input_ids, nxt), dim=-1)
            step_ids = nxt
        out = input_ids[:, -new_tokens:].tolist()  # waits for the device
        return time.perf_counter() - start, out


def response_logprobs(model, batch):
    """log p of each response token, [B, L], differentiable."""
    ids = batch["input_ids"]
    logits = model(ids)
    logp = F.log_softmax(logits.float(), dim=-1)[:, :-1]
    logp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)  # [B, T - 1]
    P, L = batch["prompt_len"], batch["old_logprobs"].shape[1]
    return logp[:, P - 1:P - 1 + L]


def ppo_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, clip_c=3.0, clamp=20.0):
    """relay's ppo_clip_loss (token-mean aggregation)."""
    ratio = (logp - old).clamp(-clamp, clamp).exp()
    loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip_low, 1 + clip_high))
    loss = torch.where(adv < 0, torch.min(loss, -adv * clip_c), loss)
    loss = torch.where(mask, loss, torch.zeros_like(loss))
    return loss.sum() / mask.sum().clamp_min(1)


def train_loss(model, batch):
    logp = response_logprobs(model, batch)
    return ppo_loss(logp, batch["old_logprobs"], batch["advantages"], batch["mask"])


def train_step(model, optimizer, batch, max_grad_norm=1.0):
    start = time.perf_counter()
    optimizer.zero_grad()
    loss = train_loss(model, batch)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return time.perf_counter() - start, float(loss), float(norm)


def load_batch(path):
    t = read_safetensors(path)
    return {
        "input_ids": t["input_ids"],
        "prompt_len": int(t["prompt_len"].item()),
        "old_logprobs": t["old_logprobs"],
        "advantages": t["advantages"],
        "mask": t["response_mask"].bool(),
    }


def check_logits(model, path, tol):
    """Compares the full forward and the cached path with relay's logits:
    ok when both are within tol x max(1, max |logit|)."""
    t = read_safetensors(path)
    ids, ref = t["input_ids"].to(model_device(model)), t["logits"].float()
    with torch.inference_mode():
        full = model(ids).float().cpu()
        split = max(1, ids.shape[1] // 2)  # prefill half, then one token per step
        past = [[None, None] for _ in model.model.layers]
        parts = [F.linear(model.hidden(ids[:, :split], past), model.head_weight())]
        for s in range(split, ids.shape[1]):
            parts.append(F.linear(model.hidden(ids[:, s:s + 1], past), model.head_weight()))
        cached = torch.cat(parts, dim=1).float().cpu()
    d_full = (full - ref).abs().max().item()
    d_cached = (cached - ref).abs().max().item()
    scale = max(1.0, ref.abs().max().item())  # tol is relative to the largest logit
    return {"ok": max(d_full, d_cached) <= tol * scale, "max_abs_diff": d_full,
            "max_abs_diff_cached": d_cached, "max_abs_logit": ref.abs().max().item(), "tol": tol}


# ---------------------------------------------------------------- memory


def status_bytes(field):
    """A /proc/self/status size (VmRSS, VmHWM) in bytes; -1 when unreadable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return -1


def release_free_cpu_memory():
    """Returns the allocator's free memory to the system (glibc's
    malloc_trim), as relay's model::release_free_cpu_memory does."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def reset_peak_rss():
    """Restarts VmHWM from the current resident set, as relay's
    model::reset_peak_rss does (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


# ---------------------------------------------------------------- threads


def set_threads(intra_op, blas):
    """Thread settings as relay's: LibTorch intra-op pool and OpenBLAS's own
    pthread pool (looked up at run time; -1 when the BLAS is not OpenBLAS)."""
    if intra_op > 0:
        torch.set_num_threads(intra_op)
    got = -1
    try:
        lib = ctypes.CDLL("libblas.so.3")
        if blas > 0:
            lib.openblas_set_num_threads(blas)
        got = lib.openblas_get_num_threads()
    except (OSError, AttributeError):
        pass
    return {"intra_op": torch.get_num_threads(), "blas": got}


# ---------------------------------------------------------------- server


class Server:
    """Commands (one JSON object a line) and their replies:
      {"cmd": "load", "dir": D, "device": "cpu", "dtype": "float32", "attention": "eager"}
                                               -> {"ok", "parameters", "seconds", "device"}
                                                  (device, dtype and attention optional, as shown)
      {"cmd": "check_logits", "file": F, "tol": x} -> {"ok", "max_abs_diff", ...}
                                                  (ok: within x times max(1, max |logit|))
      {"cmd": "decode", "prompts": [[...]], "new": N, "seed": s}
                                               -> {"ok", "seconds", "tokens", "rss_bytes",
                                                   "peak_rss_bytes"} (resident set before the
                                                  loop, and its peak during it; on a GPU
                                                  also "device_peak_bytes")
      {"cmd": "train_setup", "file": F, "lr": x}  (fresh AdamW, batch loaded)
      {"cmd": "train_step"}                    -> {"ok", "seconds", "loss", "grad_norm"}
                                                  (loss before the update, norm before clipping)
      {"cmd": "quit"}                          (no reply; so does the end of stdin)
    Any failure replies {"ok": false, "error": ...}."""

    def __init__(self):
        self.model = None
        self.batch = None
        self.optimizer = None

    def load(self, c):
        start = time.perf_counter()
        self.model = None  # the old model's memory first (a device's especially)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.model = load_model(c["dir"], c.get("device", "cpu"), c.get("dtype", "float32"),
                                c.get("attention", "eager"))
        release_free_cpu_memory()  # the file's bytes and the old model, as relay's setup does
        n = sum(p.numel() for p in self.model.parameters())
        return {"ok": True, "parameters": n, "seconds": time.perf_counter() - start,
                "device": str(model_device(self.model))}

    def check_logits(self, c):
        return check_logits(self.model, c["file"], c.get("tol", 1e-3))

    def decode(self, c):
        dev = model_device(self.model)
        gen = torch.Generator(device=dev).manual_seed(int(c.get("seed", 0)))
        reset_peak_rss()
        rss = status_bytes("VmRSS")
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        secs, out = generate(self.model, c["prompts"], int(c["new"]), gen)
        reply = {"ok": True, "seconds": secs, "tokens": sum(len(r) for r in out),
                 "rss_bytes": rss, "peak_rss_bytes": status_bytes("VmHWM")}
        if dev.type == "cuda":
            reply["device_peak_bytes"] = torch.cuda.max_memory_allocated(dev)
        return reply

    def train_setup(self, c):
        dev = model_device(self.model)
        self.batch = {k: v.to(dev) if torch.is_tensor(v) else v
                      for k, v in load_batch(c["file"]).items()}
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=c.get("lr", 1e-5),
                                           betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        return {"ok": True}

    def train_step(self, c):
        secs, loss, norm = train_step(self.model, self.optimizer, self.batch)
        return {"ok": True, "seconds": secs, "loss": loss, "grad_norm": norm}

    def run(self, inp, out):
        for line in inp:
            line = line.strip()
            if not line:
                continue
            try:
                c = json.loads(line)
                if c["cmd"] == "quit":  # no reply: the driver may be gone
                    return
                reply = getattr(self, c["cmd"])(c)
            except Exception as e:  # reported to the driver, which fails loudly
                reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            out.write(json.dumps(reply) + "\n")
            out.flush()


# ---------------------------------------------------------------- self-check


def selfcheck():
    torch.manual_seed(0)
    for model_type, tied in (("llama", True), ("qwen2", False)):
        d = {"model_type": model_type, "vocab_size": 37, "hidden_size": 32,
             "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "rope_theta": 1e4, "tie_word_embeddings": tied}
        model = CausalLM(Config(d))
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.2)
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(d, f)
            write_safetensors(os.path.join(tmp, "model.safetensors"), model.state_dict())
            loaded = load_model(tmp)
            for k, v in model.state_dict().items():
                assert torch.equal(v, loaded.state_dict()[k]), k
            ids = torch.randint(0, 37, (3, 9))
            with torch.no_grad():
                ref = model(ids)
            write_safetensors(os.path.join(tmp, "check.safetensors"),
                              {"input_ids": ids, "logits": ref})
            r = check_logits(loaded, os.path.join(tmp, "check.safetensors"), 1e-5)
            assert r["ok"], r
            secs, toks = generate(loaded, ids[:, :4].tolist(), 5, torch.Generator().manual_seed(1))
            assert len(toks) == 3 and all(len(t) == 5 for t in toks)
            with torch.no_grad():
                logp = F.log_softmax(loaded(ids), -1)[:, :-1].gather(-1, ids[:, 1:, None])
            batch = {"input_ids": ids, "prompt_len": 4,
                     "old_logprobs": logp.squeeze(-1)[:, 3:].clone(),
                     "advantages": torch.tensor([[1.0], [-1.0], [0.5]]).expand(3, 5).clone(),
                     "mask": torch.ones(3, 5, dtype=torch.bool)}
            loaded.train()
            opt = torch.optim.AdamW(loaded.parameters(), lr=1e-2, weight_decay=0.0)
            _, l0, n0 = train_step(loaded, opt, batch)
            assert math.isfinite(l0) and n0 > 0, (l0, n0)
            assert abs(l0 + 0.5 / 3) < 1e-5, l0  # ratio 1: loss = -mean(A)
            # bfloat16 (the weights rounded, fp32 norms and softmax): close to
            # fp32 at this scale, and a wrong cast (or a lost inv_freq) is not.
            low = load_model(tmp, dtype="bfloat16")
            assert low.model.embed_tokens.weight.dtype == torch.bfloat16
            assert low.inv_freq.dtype == torch.float32
            rb = check_logits(low, os.path.join(tmp, "check.safetensors"), 5e-2)
            assert rb["ok"] and rb["max_abs_diff"] > 0, rb
            _, toks = generate(low, ids[:, :4].tolist(), 5, torch.Generator().manual_seed(1))
            assert all(len(t) == 5 for t in toks)
            sdpa = "not in this torch"
            if hasattr(F, "scaled_dot_product_attention"):
                fast = load_model(tmp, attention="sdpa")
                rs = check_logits(fast, os.path.join(tmp, "check.safetensors"), 1e-5)
                assert rs["ok"], rs
                sdpa = f"{max(rs['max_abs_diff'], rs['max_abs_diff_cached']):.2e}"
            try:
                load_model(tmp, attention="flash")
                raise AssertionError("attention 'flash' was accepted")
            except ValueError:
                pass
        print(f"selfcheck {model_type} (tied={tied}): ok, max |diff| {r['max_abs_diff']:.2e}, "
              f"bfloat16 {rb['max_abs_diff']:.2e} (max |logit| {rb['max_abs_logit']:.2f}), "
              f"sdpa {sdpa}")
    print("selfcheck: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["serve", "selfcheck"])
    ap.add_argument("--threads", type=int, default=1, help="LibTorch intra-op threads")
    ap.add_argument("--blas-threads", type=int, default=0, help="OpenBLAS threads; 0 = as is")
    a = ap.parse_args()
    settings = set_threads(a.threads, a.blas_threads)
    if a.mode == "selfcheck":
        selfcheck()
        return
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints must not corrupt the protocol
    out.write(json.dumps({"ok": True, "torch": torch.__version__, **settings}) + "\n")
    out.flush()
    Server().run(sys.stdin, out)


if __name__ == "__main__":
    main()
