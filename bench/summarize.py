#!/usr/bin/env python3
"""Prints the markdown summary of one scripts/bench.sh run.

    bench/summarize.py OUT_DIR QUICK SECONDS

OUT_DIR holds machine.json, ran.txt ("NAME SECONDS STATUS" lines) and each
program's output: NAME.out (JSON lines, or one JSON array) and e2e.json.
Standard library only. Every figure comes from those files; nothing here is
a constant measured elsewhere.
"""

import datetime
import json
import os
import sys


def rows_of(path):
    """JSON objects in a file of JSON lines or one JSON array; [] if none."""
    if not os.path.exists(path):
        return []
    text = open(path).read().strip()
    if text.startswith("["):
        try:
            return [r for r in json.loads(text) if isinstance(r, dict)]
        except ValueError:
            return []
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def num(x, spec=",.0f"):
    return "-" if x is None else format(x, spec)


def ratio(x):
    return "-" if x is None else f"{x:.2f}x"


def pick(rows, **match):
    for r in rows:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def main():
    out_dir, quick, seconds = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
    machine = json.load(open(os.path.join(out_dir, "machine.json")))
    ran = {}
    for line in open(os.path.join(out_dir, "ran.txt")):
        name, secs, status = line.rstrip("\n").split(" ", 2)
        ran[name] = (int(secs), status)
    load_after = open("/proc/loadavg").read().split()[:3]

    table = []  # (area, figure, value, baseline, ratio)

    # Decode throughput (rollout_bench).
    decode = rows_of(os.path.join(out_dir, "decode.out"))
    for model in ("qwen2-100m", "tiny"):
        batches = sorted({r["batch"] for r in decode if r.get("model") == model})
        if model == "tiny" and batches:
            batches = batches[-1:]
        for b in batches:
            e = pick(decode, model=model, bench="kv", batch=b, mode="engine")
            base = pick(decode, model=model, bench="kv", batch=b, mode="re-encode")
            if e and base:
                table.append(("decode", f"{model}, batch {b}: engine tokens/s",
                              num(e["tokens_per_s"]), f"re-encode {num(base['tokens_per_s'])}",
                              ratio(e["ratio"])))
            c = pick(decode, model=model, bench="mixed", batch=b, mode="continuous")
            st = pick(decode, model=model, bench="mixed", batch=b, mode="static")
            if c and st and b > 1:
                table.append(("decode", f"{model}, batch {b}, mixed lengths: continuous tokens/s",
                              num(c["tokens_per_s"]), f"static batching {num(st['tokens_per_s'])}",
                              ratio(c["ratio"])))

    # Decode steps at a long context: attention over the paged cache read in
    # place against gathered out of it (rollout_bench --only attn).
    attention = rows_of(os.path.join(out_dir, "decode_attention.out"))
    for r in attention:
        if r.get("bench") != "attn" or r.get("mode") != "in-place":
            continue
        base = pick(attention, model=r["model"], bench="attn", batch=r["batch"], mode="gathered")
        context = (base or {}).get("notes", "").split(",")[0]
        table.append(("decode", f"{r['model']}, batch {r['batch']}, {context}: decode tokens/s, "
                      "attention reading the cache in place",
                      num(r["tokens_per_s"]),
                      f"gathered {num(base['tokens_per_s'])}" if base else "-",
                      ratio(r["ratio"])))

    # One sample() call: the fused CPU path against the batched ops
    # (rollout_bench --only sampler).
    sampler = rows_of(os.path.join(out_dir, "sampler.out"))
    for r in sampler:
        if r.get("bench") != "sampler" or r.get("mode") != "fused":
            continue
        base = pick(sampler, model=r["model"], bench="sampler", batch=r["batch"], mode="batched")
        table.append(("decode", f"sampler, {r['model'].replace('vocab-', 'vocabulary ')}, "
                      f"batch {r['batch']}: draws/s, fused CPU path",
                      num(r["tokens_per_s"]),
                      f"batched ops {num(base['tokens_per_s'])}" if base else "-",
                      ratio(r["ratio"])))

    # The engine in bf16 (rollout.dtype) against fp32 on the same weights
    # (rollout_bench --only dtype).
    dtype = rows_of(os.path.join(out_dir, "decode_dtype.out"))
    for r in dtype:
        if r.get("bench") != "dtype" or r.get("mode") != "bf16":
            continue
        base = pick(dtype, model=r["model"], bench="dtype", batch=r["batch"], mode="fp32")
        table.append(("decode", f"{r['model']}, batch {r['batch']}: engine tokens/s, "
                      "rollout.dtype bfloat16",
                      num(r["tokens_per_s"]),
                      f"float32 {num(base['tokens_per_s'])}" if base else "-",
                      ratio(r["ratio"])))

    # Trainer memory and work: optimizer sharding, sequence packing.
    sharding = rows_of(os.path.join(out_dir, "sharding.out"))
    for r in sharding:
        mode = r.get("sharding")
        if mode not in ("optimizer", "full"):
            continue
        base = pick(sharding, model=r["model"], world=r["world"], sharding="none")
        # optimizer: what it shards (master copies and moments); full: the
        # weights, gradients and moments a rank holds.
        parts = (["master_gib", "moments_gib"] if mode == "optimizer"
                 else ["weights_gib", "gradients_gib", "master_gib", "moments_gib"])
        held = sum(r[k] for k in parts)
        base_held = sum(base[k] for k in parts) if base else None
        what = "master + AdamW" if mode == "optimizer" else "weights + grads + master + AdamW"
        table.append(("trainer", f"{r['model']}, {r['world']} ranks, sharding {mode}: "
                      f"{what} GiB per rank (step time vs none)",
                      num(held, ".3f"), f"sharding none {num(base_held, '.3f')}",
                      f"{ratio(held / base_held if base_held else None)} "
                      f"({ratio(r.get('step_vs_none'))} time)"))
    for r in rows_of(os.path.join(out_dir, "packing.out")):
        table.append(("trainer", f"{r['model']}, {r['rows']} rows, pack_sequences: padding "
                      "computed; step s", f"{100 * r['padding_packed']:.1f}%; "
                      f"{num(r['step_packed_s'], '.2f')}",
                      f"padded {100 * r['padding_padded']:.1f}%; "
                      f"{num(r['step_padded_s'], '.2f')}",
                      f"{ratio(r['speedup'])} speed"))

    lora = rows_of(os.path.join(out_dir, "lora.out"))
    for r in lora:
        if r.get("bench") == "lora":
            table.append(("trainer", f"{r['model']}, LoRA {r['lora']}: bytes per weight version; "
                          "trainer GiB; step s", f"{num(r['version_bytes_lora'] / 2**20, '.2f')} MiB; "
                          f"{num(r['trainer_gib_lora'], '.3f')}; {num(r['step_s_lora'], '.2f')}",
                          f"full fine-tuning {num(r['version_bytes_full'] / 2**20, '.1f')} MiB; "
                          f"{num(r['trainer_gib_full'], '.3f')}; {num(r['step_s_full'], '.2f')}",
                          f"{ratio(r['version_ratio'])} bytes ({ratio(r['step_ratio'])} time)"))
        elif r.get("bench") == "lora_decode":
            table.append(("decode", f"{r['model']}, LoRA {r['lora']} as a side path: tokens/s",
                          num(r["side_tokens_per_s"]),
                          f"merged into the weights {num(r['merged_tokens_per_s'])} "
                          f"(+{num(r['merge_s'], '.3f')} s merge per version)",
                          ratio(r["merged_tokens_per_s"] and
                                r["side_tokens_per_s"] / r["merged_tokens_per_s"])))

    # Store and ingest.
    store = rows_of(os.path.join(out_dir, "store.out"))
    raw = pick(store, path="raw file")
    s = pick(store, path="store")
    if raw and s:
        table.append(("store", "RolloutStore::append, fsync'd: groups/s", num(s["groups_per_s"]),
                      f"file append + fdatasync {num(raw['groups_per_s'])}", ratio(s["vs_raw"])))
    ingest = rows_of(os.path.join(out_dir, "ingest.out"))
    base = pick(ingest, path="store (fsync)")
    grpc = [r for r in ingest if r.get("path") == "grpc (fsync)"]
    for r in sorted(grpc, key=lambda r: (r["batch"], r["clients"])):
        if r["batch"] == max(g["batch"] for g in grpc):
            table.append(("ingest", f"gRPC, durable, {r['clients']} client(s) x {r['batch']} "
                          "groups/stream: groups/s", num(r["groups_per_s"]),
                          f"store alone, fsync'd {num(base['groups_per_s']) if base else '-'}",
                          ratio(r["vs_store"])))

    # Weight sync.
    ws = rows_of(os.path.join(out_dir, "weight_sync.out"))
    for c in sorted({r["clients"] for r in ws if "clients" in r}):
        tcp = pick(ws, mode="tcp", clients=c)
        gloo = [r for r in ws if r.get("mode") == "gloo" and r.get("clients") == c]
        rel = [r for r in ws if r.get("mode") == "relay" and r.get("clients") == c]
        base = f"loopback TCP {num(tcp['gb_per_s'], '.2f')}" if tcp else "-"
        for g in gloo:
            table.append(("weight sync", f"Gloo broadcast, {c} client(s), {g['bucket']}: GB/s",
                          num(g["gb_per_s"], ".2f"), base, ratio(g["vs_tcp"])))
        for r in rel:
            table.append(("weight sync", f"relay broadcast, {c} client(s), {r['bucket']}: GB/s",
                          num(r["gb_per_s"], ".2f"), base,
                          f"{ratio(r['vs_tcp'])} ({ratio(r.get('vs_gloo'))} of Gloo)"))
        f = pick(ws, mode="grpc", clients=c)
        if f:
            table.append(("weight sync", f"gRPC fetch, {c} client(s): GB/s",
                          num(f["gb_per_s"], ".2f"), base,
                          f"{ratio(f['vs_tcp'])} ({ratio(f.get('vs_gloo'))} of Gloo)"))

    for r in ws:
        if r.get("mode") != "decode_through_fetch":
            continue
        table.append(("weight sync", f"decoding through a fetched version (loopback), batch "
                      f"{r['batch']}: tokens/s, fetched on a thread",
                      num(r["background_tokens_per_s"]),
                      f"the loop stops for the fetch {num(r['loop_tokens_per_s'])}",
                      ratio(r["vs_loop"])))

    # Version switch.
    for r in rows_of(os.path.join(out_dir, "version_switch.out")):
        extra = ""
        if r.get("recomputed_tokens"):
            extra = f", {r['recomputed_tokens']} positions re-run"
        if r.get("dropped_tokens"):
            extra = f", {r['dropped_tokens']} tokens dropped"
        table.append(("version switch", f"{r['model']}, interrupt {r['interrupt']}, batch "
                      f"{r['batch']}, {r['in_flight_tokens']} tokens in flight: pause ms{extra}",
                      num(r["pause_ms"], ".1f"),
                      f"decode step {num(r['decode_step_ms'], '.1f')} ms; parameter copy "
                      f"{num(r['copy_ms'], '.1f')} ms",
                      f"{r['pause_vs_step']:.1f} steps; {r['pause_vs_copy']:.1f}x copy"))

    # End to end.
    e2e = rows_of(os.path.join(out_dir, "e2e.json"))
    sync = pick(e2e, bound=0)
    for r in e2e:
        if r["bound"] == 0:
            continue
        table.append(("end to end", f"arith, max_staleness {r['bound']}: samples/s (RL phase)",
                      num(r["samples_per_s"]),
                      f"sync (max_staleness 0) {num(sync['samples_per_s']) if sync else '-'}",
                      ratio(r["samples_vs_sync"])))
    for r in e2e:
        if r["bound"] == 0:
            continue
        missed = f"; {r['missed']} of {r['runs']} runs never got there" if r.get("missed") else ""
        table.append(("end to end", f"arith, max_staleness {r['bound']}: s to accuracy "
                      f"{r['target']} (evals counted; net of them){missed}",
                      f"{num(r['tta_s'], '.2f')} ({num(r['tta_net_s'], '.2f')})",
                      f"sync {num(sync['tta_s'], '.2f')} ({num(sync['tta_net_s'], '.2f')})"
                      if sync else "-",
                      f"{ratio(r['tta_vs_sync'])} time ({ratio(r['tta_net_vs_sync'])})"))

    # Against plain PyTorch on the same weights (rollout_bench --only py,
    # trainer_bench) and against the machine's limits.
    # decode_05b: the full pass's Qwen2.5-0.5B directory (batches 1 and 8).
    py = (rows_of(os.path.join(out_dir, "decode_python.out")) +
          rows_of(os.path.join(out_dir, "decode_05b.out")))
    for r in py:
        if r.get("bench") != "py" or r.get("mode") != "engine":
            continue
        base = pick(py, model=r["model"], bench="py", batch=r["batch"], mode="python")
        if not base:
            continue
        context = base.get("notes", "").split(",")[0]
        table.append(("decode", f"{r['model']}, batch {r['batch']}, {context}: engine tokens/s",
                      num(r["tokens_per_s"], ",.1f"),
                      f"plain-PyTorch generate loop {num(base['tokens_per_s'], ',.1f')}",
                      ratio(r["ratio"])))
        kinds = {"gemm-only": "weight GEMMs alone",
                 "products": "weight products as the engine runs them, alone"}
        for bound in ("roofline", "gemm-only", "products"):
            b = pick(py, model=r["model"], bench="bound", batch=r["batch"], mode=bound)
            if b:
                kind = ("memory-bound" if "memory-bound" in b.get("notes", "")
                        else "compute-bound") if bound == "roofline" else kinds[bound]
                table.append(("decode", f"{r['model']}, batch {r['batch']}: engine tokens/s "
                              f"as a share of the {bound} bound ({kind})",
                              num(r["tokens_per_s"], ",.1f"),
                              f"{bound} {num(b['tokens_per_s'], ',.1f')}",
                              ratio(b["ratio"])))
    # trainer_05b: the full pass's Qwen2.5-0.5B step (--no-core: no core row).
    trainer = (rows_of(os.path.join(out_dir, "trainer.out")) +
               rows_of(os.path.join(out_dir, "trainer_05b.out")))
    for r in trainer:
        if r.get("mode") not in ("trainer", "core"):
            continue
        base = pick(trainer, model=r["model"], shape=r["shape"], mode="python")
        if not base:
            continue
        what = ("Trainer::step" if r["mode"] == "trainer"
                else "the Python step's loop in C++ (core)")
        table.append(("trainer", f"{r['model']}, {r['shape']} (rows x tokens): {what}, "
                      "tokens/s", num(r["tokens_per_s"], ",.0f"),
                      f"the same step in PyTorch {num(base['tokens_per_s'], ',.0f')}",
                      ratio(r["ratio"])))
    for r in trainer:
        if r.get("mode") == "bound":
            # notes: "<F> GFLOP/step at peak <P> GFLOP/s; trainer at <T> GFLOP/s"
            parts = r.get("notes", "").split("; trainer at ")
            table.append(("trainer", f"{r['model']}, {r['shape']}: Trainer::step GFLOP/s as a "
                          "share of the fp32 GEMM peak",
                          parts[1].split(" ")[0] if len(parts) == 2 else "-",
                          parts[0].split(" at ")[-1] if len(parts) == 2 else "-",
                          ratio(r["ratio"])))

    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    print(f"## relay benchmarks ({'quick' if quick else 'full'} pass, {when}, "
          f"{seconds} s of benchmarking)")
    print()
    print(f"Machine: {machine['cpu']}, {machine['cores']} cores "
          f"({machine['threads_per_core']} thread(s) per core), {machine['memory_gib']} GiB; "
          f"{machine['os']}; {machine['compiler']}; LibTorch {machine['torch']}; "
          f"BLAS {machine['blas']}"
          f"{'; ' + machine['blas_kernels'] if machine.get('blas_kernels') else ''}. Load average (1/5/15 min) before "
          f"{' '.join(machine['load_before'])}, after {' '.join(load_after)}.")
    print()
    print("| area | figure (median of the program's repetitions) | value | baseline, same run "
          "| ratio |")
    print("|---|---|---:|---|---:|")
    for row in table:
        print("| " + " | ".join(row) + " |")
    print()
    print("Programs: " + "; ".join(f"{n} {s} s {st}" if st == "ok" else f"{n}: {st}"
                                   for n, (s, st) in ran.items()) + ".")


if __name__ == "__main__":
    main()
