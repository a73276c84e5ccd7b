#!/usr/bin/env python3
"""Reproducible llama.cpp CPU benchmark of few-layer, full-width MoE models.

One script, four steps, each skipped when its output already exists:

  build      pip-download the llama-cpp-python sdist of a pinned version (it vendors llama.cpp),
             build llama-bench and llama-quantize with CMake (CPU only, Release, AVX-512, no AMX).
  gguf       write GGUF files of MoE models at their real widths and real vocabulary but only a
             few layers, with random weights (fixed seed), in BF16 (and gpt-oss in native MXFP4),
             then llama-quantize them to the other precisions.
  bandwidth  measure this box's host memory bandwidth (small C STREAM-like program, 1 and 2 threads).
  bench      run llama-bench (tg and pp, several thread counts, -o json) on every (model, precision)
             and write llamacpp-measured.json / .csv.

Python needs: numpy and pyyaml (gguf-py is taken from the vendored llama.cpp tree). The build needs
cmake, a C/C++ compiler and (optionally) ninja. It does not use casmoe's code.

Load guard: another user may share the cores, so before each llama-bench run the script samples
/proc/stat for --sample-s seconds (the box is idle on our side then, so every busy CPU belongs to
someone else) and, for the first run, also looks at the 1-minute load average. If either is above
--max-load it waits (--on-busy wait, up to --wait-max-s), warns and runs (--on-busy warn) or stops
(--on-busy refuse). During each run it also measures the CPU time that was NOT used by llama-bench
("foreign" CPU, in cores); a row whose foreign CPU exceeds --max-load is marked valid=false.
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import hashlib
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tarfile
import time
import zlib
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
LLAMA_CPP_PYTHON_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SEED = 20260101

# ----------------------------------------------------------------------------------------------
# Model shapes. Real widths from the public HF config.json files (checked against
# casmoe/presets/models.toml); only the layer count is cut down.
# ----------------------------------------------------------------------------------------------
MODELS = {
    "qwen3-30b-a3b": dict(
        arch="qwen3moe", layers=3, real_layers=48, hidden=2048, experts=128, top_k=8, expert_ffn=768,
        heads=32, kv_heads=4, head_dim=128, vocab=151936, ctx=40960, rope_base=1e6, rms_eps=1e-6,
        shared_experts=0, dense_layers=0,
    ),
    "gpt-oss-20b": dict(
        arch="gpt-oss", layers=2, real_layers=24, hidden=2880, experts=32, top_k=4, expert_ffn=2880,
        heads=64, kv_heads=8, head_dim=64, vocab=201088, ctx=131072, rope_base=150000.0, rms_eps=1e-5,
        sliding_window=128, shared_experts=0, dense_layers=0,
    ),
    "mixtral-8x7b": dict(
        arch="llama", layers=2, real_layers=32, hidden=4096, experts=8, top_k=2, expert_ffn=14336,
        heads=32, kv_heads=8, head_dim=128, vocab=32000, ctx=32768, rope_base=1e6, rms_eps=1e-5,
        shared_experts=0, dense_layers=0,
    ),
    "deepseek-v2-lite": dict(
        arch="deepseek2", layers=4, real_layers=27, hidden=2048, experts=64, top_k=6, expert_ffn=1408,
        heads=16, kv_heads=16, head_dim=192, vocab=102400, ctx=163840, rope_base=10000.0, rms_eps=1e-6,
        shared_experts=2, dense_layers=1, dense_ffn=10944, kv_lora_rank=512, qk_nope=128, qk_rope=64,
        v_head_dim=128,
    ),
}

# Precisions per model. "BF16" is written by this script; "MXFP4" (gpt-oss only) is also written
# directly: expert tensors MXFP4 and everything else BF16, as convert_hf_to_gguf.py makes from the
# released MXFP4 checkpoint. All others come from llama-quantize <bf16 file> <type>.
PRECISIONS = {
    "qwen3-30b-a3b": ["BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "MXFP4_MOE"],
    "gpt-oss-20b": ["BF16", "MXFP4", "MXFP4_MOE", "Q8_0", "Q4_K_M", "Q4_0"],
    "mixtral-8x7b": ["BF16", "Q8_0", "Q4_K_M", "Q4_0"],
    "deepseek-v2-lite": ["BF16", "Q8_0", "Q5_K_M", "Q4_K_M", "Q4_0"],
}


def log(msg: str) -> None:
    print(f"[{_dt.datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


def die(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def run(cmd, **kw) -> subprocess.CompletedProcess:
    log("$ " + " ".join(str(c) for c in cmd))
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


# ----------------------------------------------------------------------------------------------
# Step 1: source + build
# ----------------------------------------------------------------------------------------------
def src_dir(work: Path, version: str) -> Path:
    return work / "src" / f"llama_cpp_python-{version}"


def llama_dir(work: Path, version: str) -> Path:
    return src_dir(work, version) / "vendor" / "llama.cpp"


def vendored_commit(work: Path, version: str) -> str:
    """The llama.cpp commit the sdist vendors: its shipped (depth-1) git metadata, else its CHANGELOG."""
    r = subprocess.run(["git", "-C", str(llama_dir(work, version)), "rev-parse", "HEAD"],
                       capture_output=True, text=True)
    if r.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", r.stdout.strip()):
        return r.stdout.strip()[:9]
    text = (src_dir(work, version) / "CHANGELOG.md").read_text()
    m = re.search(r"^## \[" + re.escape(version) + r"\](.*?)(?=^## \[)", text, re.S | re.M)
    if not m:
        return "unknown"
    c = re.search(r"llama\.cpp@([0-9a-f]{7,40})", m.group(1))
    return c.group(1) if c else "unknown"


# ggml's CPU feature switches. GGML_NATIVE=ON (-march=native) also turns on AMX on this Sapphire
# Rapids-class VM, and ggml's AMX kernels then die with SIGILL (tilezero in tinygemm_kernel_amx) for every
# Q4_0/Q8_0/K-quant model, although the kernel grants AMX permission and a standalone AMX test runs.
# So the build names the AVX-512 features explicitly and leaves AMX off. --native restores -march=native.
CPU_FLAGS = [
    "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_AVX_VNNI=ON", "-DGGML_FMA=ON",
    "-DGGML_F16C=ON", "-DGGML_BMI2=ON", "-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON",
    "-DGGML_AVX512_BF16=ON", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
]


def step_build(args) -> dict:
    work, ver = args.work, args.llama_cpp_python
    info_path = work / "build-info.json"
    bench_bin = work / "build" / "bin" / "llama-bench"
    quant_bin = work / "build" / "bin" / "llama-quantize"
    if info_path.exists() and bench_bin.exists() and quant_bin.exists():
        log(f"build: already done ({bench_bin})")
        return json.loads(info_path.read_text())

    info: dict = {"llama_cpp_python": ver}
    (work / "src").mkdir(parents=True, exist_ok=True)
    tarball = work / "src" / f"llama_cpp_python-{ver}.tar.gz"
    if not tarball.exists():
        t0 = time.time()
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             f"llama-cpp-python=={ver}", "-d", work / "src"])
        info["download_s"] = round(time.time() - t0, 1)
        if not tarball.exists():
            die(f"pip download did not produce {tarball}")
    sha = hashlib.sha256(tarball.read_bytes()).hexdigest()
    info["sdist_sha256"] = sha
    if ver == LLAMA_CPP_PYTHON_VERSION and sha != LLAMA_CPP_PYTHON_SHA256:
        die(f"{tarball} sha256 {sha} differs from the pinned {LLAMA_CPP_PYTHON_SHA256}")
    if not llama_dir(work, ver).exists():
        log(f"extracting {tarball}")
        with tarfile.open(tarball) as tf:
            tf.extractall(work / "src")
    commit = vendored_commit(work, ver)
    info["llama_cpp_commit"] = commit

    for tool in ("cmake", "cc", "c++"):
        if shutil.which(tool) is None:
            die(f"{tool} not found: apt-get install cmake build-essential (ninja-build optional)")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    cfg = [
        "cmake", "-S", llama_dir(work, ver), "-B", work / "build", *gen,
        "-DCMAKE_BUILD_TYPE=Release", "-DGGML_CUDA=OFF", *CPU_FLAGS,
        "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
        f"-DLLAMA_BUILD_COMMIT={commit}",
    ]
    if args.native:
        cfg = [c for c in cfg if not str(c).startswith("-DGGML_") or str(c) == "-DGGML_CUDA=OFF"] + ["-DGGML_NATIVE=ON"]
    info["cmake_configure"] = " ".join(str(c) for c in cfg)
    t0 = time.time()
    run(["nice", "-n", "10", *cfg])
    info["configure_s"] = round(time.time() - t0, 1)
    t0 = time.time()
    run(["nice", "-n", "10", "cmake", "--build", work / "build", "--target", "llama-bench", "llama-quantize",
         "-j", str(args.jobs)])
    info["build_s"] = round(time.time() - t0, 1)
    info["build_jobs"] = args.jobs
    info["compiler"] = subprocess.run(["cc", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    info_path.write_text(json.dumps(info, indent=2))
    log(f"build: done in {info['build_s']} s")
    return info


# ----------------------------------------------------------------------------------------------
# Step 2: GGUF generation
# ----------------------------------------------------------------------------------------------
def import_gguf(work: Path, ver: str):
    sys.path.insert(0, str(llama_dir(work, ver) / "gguf-py"))
    try:
        import numpy as np  # noqa: F401
        import gguf  # noqa: F401
    except ImportError as e:  # pragma: no cover
        die(f"cannot import numpy/gguf ({e}); pip install numpy pyyaml")
    import numpy as np
    import gguf
    return np, gguf


def tensor_plan(name: str, m: dict, gguf):
    """List of (tensor name, numpy-order shape, kind) with kind in weight/norm/bias/zero/expert."""
    T = []
    H, V = m["hidden"], m["vocab"]
    T.append(("token_embd.weight", (V, H), "weight"))
    for i in range(m["layers"]):
        b = f"blk.{i}."
        T.append((b + "attn_norm.weight", (H,), "norm"))
        if m["arch"] == "deepseek2":
            r, nope, rope, vd, nh = m["kv_lora_rank"], m["qk_nope"], m["qk_rope"], m["v_head_dim"], m["heads"]
            T.append((b + "attn_q.weight", (nh * (nope + rope), H), "weight"))
            T.append((b + "attn_kv_a_mqa.weight", (r + rope, H), "weight"))
            T.append((b + "attn_kv_a_norm.weight", (r,), "norm"))
            T.append((b + "attn_k_b.weight", (nh, r, nope), "weight"))
            T.append((b + "attn_v_b.weight", (nh, vd, r), "weight"))
            T.append((b + "attn_output.weight", (H, nh * vd), "weight"))
        else:
            q, kv = m["heads"] * m["head_dim"], m["kv_heads"] * m["head_dim"]
            T.append((b + "attn_q.weight", (q, H), "weight"))
            T.append((b + "attn_k.weight", (kv, H), "weight"))
            T.append((b + "attn_v.weight", (kv, H), "weight"))
            T.append((b + "attn_output.weight", (H, q), "weight"))
            if m["arch"] == "qwen3moe":
                T.append((b + "attn_q_norm.weight", (m["head_dim"],), "norm"))
                T.append((b + "attn_k_norm.weight", (m["head_dim"],), "norm"))
            if m["arch"] == "gpt-oss":
                T.append((b + "attn_q.bias", (q,), "bias"))
                T.append((b + "attn_k.bias", (kv,), "bias"))
                T.append((b + "attn_v.bias", (kv,), "bias"))
                T.append((b + "attn_output.bias", (H,), "bias"))
                T.append((b + "attn_sinks.weight", (m["heads"],), "zero"))
        # gpt-oss stores the pre-FFN norm as post_attention_norm
        T.append((b + ("post_attention_norm.weight" if m["arch"] == "gpt-oss" else "ffn_norm.weight"), (H,), "norm"))
        if i < m.get("dense_layers", 0):
            F = m["dense_ffn"]
            T.append((b + "ffn_gate.weight", (F, H), "weight"))
            T.append((b + "ffn_up.weight", (F, H), "weight"))
            T.append((b + "ffn_down.weight", (H, F), "weight"))
            continue
        E, F = m["experts"], m["expert_ffn"]
        T.append((b + "ffn_gate_inp.weight", (E, H), "weight"))
        T.append((b + "ffn_gate_exps.weight", (E, F, H), "expert"))
        T.append((b + "ffn_up_exps.weight", (E, F, H), "expert"))
        T.append((b + "ffn_down_exps.weight", (E, H, F), "expert"))
        if m["arch"] == "gpt-oss":
            T.append((b + "ffn_gate_inp.bias", (E,), "bias"))
            T.append((b + "ffn_gate_exps.bias", (E, F), "bias"))
            T.append((b + "ffn_up_exps.bias", (E, F), "bias"))
            T.append((b + "ffn_down_exps.bias", (E, H), "bias"))
        if m.get("shared_experts", 0):
            S = m["shared_experts"] * F
            T.append((b + "ffn_gate_shexp.weight", (S, H), "weight"))
            T.append((b + "ffn_up_shexp.weight", (S, H), "weight"))
            T.append((b + "ffn_down_shexp.weight", (H, S), "weight"))
    T.append(("output_norm.weight", (H,), "norm"))
    T.append(("output.weight", (V, H), "weight"))
    return T


def add_metadata(w, name: str, m: dict, gguf, file_type: int) -> None:
    w.add_name(f"{name} (random weights, {m['layers']} of {m['real_layers']} layers)")
    w.add_file_type(file_type)
    w.add_context_length(m["ctx"])
    w.add_embedding_length(m["hidden"])
    w.add_block_count(m["layers"])
    w.add_head_count(m["heads"])
    w.add_rope_freq_base(m["rope_base"])
    w.add_layer_norm_rms_eps(m["rms_eps"])
    w.add_expert_count(m["experts"])
    w.add_expert_used_count(m["top_k"])
    w.add_vocab_size(m["vocab"])
    arch = m["arch"]
    if arch == "deepseek2":
        w.add_head_count_kv(1)  # MLA is stored as MQA over the latent, as convert_hf_to_gguf.py does
        w.add_feed_forward_length(m["dense_ffn"])
        w.add_leading_dense_block_count(m["dense_layers"])
        w.add_q_lora_rank(0)  # DeepSeek-V2-Lite: q_lora_rank null (full query projection)
        w.add_kv_lora_rank(m["kv_lora_rank"])
        w.add_key_length(m["kv_lora_rank"] + m["qk_rope"])
        w.add_value_length(m["kv_lora_rank"])
        w.add_key_length_mla(m["qk_nope"] + m["qk_rope"])
        w.add_value_length_mla(m["v_head_dim"])
        w.add_expert_feed_forward_length(m["expert_ffn"])
        w.add_expert_shared_count(m["shared_experts"])
        w.add_expert_weights_scale(1.0)
        w.add_rope_dimension_count(m["qk_rope"])
    else:
        w.add_head_count_kv(m["kv_heads"])
        w.add_key_length(m["head_dim"])
        w.add_value_length(m["head_dim"])
        w.add_rope_dimension_count(m["head_dim"])
        if arch == "llama":
            w.add_feed_forward_length(m["expert_ffn"])  # Mixtral: intermediate_size is the expert width
        else:
            w.add_expert_feed_forward_length(m["expert_ffn"])
        if arch == "gpt-oss":
            w.add_feed_forward_length(m["expert_ffn"])
            w.add_sliding_window(m["sliding_window"])
        if arch == "qwen3moe":
            w.add_feed_forward_length(6144)  # config intermediate_size (unused by the MoE layers)
    # No real tokenizer: llama.cpp's "none" vocabulary with {arch}.vocab_size dummy tokens.
    # llama-bench feeds random token ids, so the tokenizer plays no part in the timings.
    w.add_tokenizer_model("none")


def write_gguf(path: Path, name: str, m: dict, np, gguf, mxfp4_experts: bool) -> None:
    """Stream one GGUF to disk, tensor by tensor (peak memory ~2x the largest tensor)."""
    Q = gguf.GGMLQuantizationType
    ftype = gguf.LlamaFileType.MOSTLY_MXFP4_MOE if mxfp4_experts else gguf.LlamaFileType.MOSTLY_BF16
    tmp = path.with_suffix(".gguf.tmp")
    w = gguf.GGUFWriter(tmp, m["arch"])
    add_metadata(w, name, m, gguf, int(ftype))
    if mxfp4_experts:
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    plan = tensor_plan(name, m, gguf)
    specs = []
    for tname, shape, kind in plan:
        if kind in ("norm", "bias", "zero"):
            specs.append((tname, shape, kind, Q.F32, int(np.prod(shape)) * 4))
        elif kind == "expert" and mxfp4_experts:
            blk, tsz = gguf.GGML_QUANT_SIZES[Q.MXFP4]
            if shape[-1] % blk:
                die(f"{tname}: row {shape[-1]} not a multiple of {blk}")
            nbytes = int(np.prod(shape[:-1])) * (shape[-1] // blk) * tsz
            specs.append((tname, shape, kind, Q.MXFP4, nbytes))
        else:
            specs.append((tname, shape, kind, Q.BF16, int(np.prod(shape)) * 2))
    for tname, shape, kind, qt, nbytes in specs:
        if qt == Q.F32:
            w.add_tensor_info(tname, shape, np.dtype(np.float32), nbytes)
        else:
            # byte shape: numpy-order shape whose last dim is in bytes
            blk, tsz = gguf.GGML_QUANT_SIZES[qt]
            bshape = (*shape[:-1], shape[-1] // blk * tsz)
            w.add_tensor_info(tname, bshape, np.dtype(np.uint8), nbytes, raw_dtype=qt)
    w.write_header_to_file(tmp)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = sum(s[4] for s in specs)
    done = 0
    t0 = time.time()
    for tname, shape, kind, qt, nbytes in specs:
        rng = np.random.default_rng([SEED, zlib.crc32(tname.encode())])
        n = int(np.prod(shape))
        if qt == Q.F32:
            if kind == "norm":
                arr = np.ones(n, dtype=np.float32)
            elif kind == "zero":
                arr = np.zeros(n, dtype=np.float32)
            else:
                arr = (rng.standard_normal(n, dtype=np.float32) * 0.01).astype(np.float32)
            data = arr.view(np.uint8)
        elif qt == Q.BF16:
            # random bf16 bit patterns: random sign and 7-bit mantissa, exponent 116..123,
            # i.e. |w| log-uniform in [2^-11, 2^-4); no NaN/Inf/denormals.
            u = rng.integers(0, 1 << 16, n, dtype=np.uint16)
            e = u >> 7
            e &= 7
            e += 116
            e <<= 7
            u &= 0x807F
            u |= e
            del e
            data = u.view(np.uint8)
        else:  # MXFP4: random nibbles, E8M0 scale 2^-8..2^-5
            blk, tsz = gguf.GGML_QUANT_SIZES[qt]
            raw = rng.integers(0, 256, nbytes, dtype=np.uint8).reshape(-1, tsz)
            raw[:, 0] = 119 + (raw[:, 0] & 3)
            data = raw.reshape(-1)
        w.write_tensor_data(data)
        del data
        done += nbytes
        if nbytes > 200e6:
            log(f"  {tname}: {nbytes/1e9:.2f} GB ({done/total:.0%}, {time.time()-t0:.0f} s)")
    w.close()
    tmp.rename(path)


def gguf_path(work: Path, name: str, m: dict, prec: str) -> Path:
    return work / "gguf" / f"{name}-{m['layers']}L-{prec}.gguf"


def describe_gguf(path: Path, gguf) -> dict:
    """Tensor types as stored in the file (count and bytes per ggml type)."""
    r = gguf.GGUFReader(path)
    by: dict = {}
    exp_types = set()
    for t in r.tensors:
        k = t.tensor_type.name
        d = by.setdefault(k, {"n": 0, "bytes": 0})
        d["n"] += 1
        d["bytes"] += int(t.n_bytes)
        if "_exps." in t.name and t.name.endswith(".weight"):
            exp_types.add(k)
    ft = r.fields.get("general.file_type")
    ftv = int(ft.parts[ft.data[0]][0]) if ft else None
    return {"tensor_types": by, "expert_tensor_types": sorted(exp_types),
            "general.file_type": ftv,
            "file_type_name": gguf.LlamaFileType(ftv).name if ftv is not None else None}


def step_gguf(args, build: dict) -> dict:
    np, gguf = import_gguf(args.work, args.llama_cpp_python)
    (args.work / "gguf").mkdir(exist_ok=True)
    man_path = args.work / "gguf-manifest.json"
    manifest = json.loads(man_path.read_text()) if man_path.exists() else {}
    quant = args.work / "build" / "bin" / "llama-quantize"
    for name in args.models:
        m = MODELS[name]
        for prec in PRECISIONS[name]:
            if args.precisions and prec not in args.precisions:
                continue
            p = gguf_path(args.work, name, m, prec)
            key = p.name
            if p.exists() and key in manifest:
                continue
            t0 = time.time()
            if not p.exists():
                if prec in ("BF16", "MXFP4"):
                    log(f"gguf: writing {p.name}")
                    write_gguf(p, name, m, np, gguf, mxfp4_experts=(prec == "MXFP4"))
                else:
                    src = gguf_path(args.work, name, m, "BF16")
                    if not src.exists():
                        die(f"{src} missing: generate BF16 first")
                    log(f"gguf: llama-quantize {src.name} -> {prec}")
                    qlog = args.work / "logs" / f"quantize-{p.stem}.log"
                    qlog.parent.mkdir(exist_ok=True)
                    with open(qlog, "w") as f:
                        rc = subprocess.run(["nice", "-n", "10", str(quant), str(src), str(p) + ".tmp", prec,
                                             str(args.quant_threads)], stdout=f, stderr=subprocess.STDOUT).returncode
                    if rc != 0:
                        die(f"llama-quantize failed ({rc}), see {qlog}")
                    os.rename(str(p) + ".tmp", p)
            info = describe_gguf(p, gguf)
            info.update(model=name, precision=prec, file=str(p), file_bytes=p.stat().st_size,
                        make_s=round(time.time() - t0, 1))
            manifest[key] = info
            man_path.write_text(json.dumps(manifest, indent=2))
            log(f"gguf: {p.name} {p.stat().st_size/1e9:.2f} GB, {info['file_type_name']}, "
                f"experts {info['expert_tensor_types']} ({info['make_s']} s)")
    return manifest


# ----------------------------------------------------------------------------------------------
# Load guard
# ----------------------------------------------------------------------------------------------
def loadavg() -> list:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def cpu_jiffies() -> tuple:
    f = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    v = [int(x) for x in f]
    idle = v[3] + v[4]
    return sum(v[:8]) - idle, v[7]  # busy (incl. hypervisor steal), steal


HZ = os.sysconf("SC_CLK_TCK")


def busy_cores(sample_s: float) -> float:
    b0, _ = cpu_jiffies()
    time.sleep(sample_s)
    b1, _ = cpu_jiffies()
    return (b1 - b0) / HZ / sample_s


def wait_quiet(args, first: bool) -> dict:
    t0 = time.time()
    while True:
        la = loadavg()
        bc = busy_cores(args.sample_s)
        if args.gate == "loadavg":  # literal 1-min load average gate before every run (slow: our own
            busy = la[0] > args.max_load  # previous run raises it, so each run waits for it to decay)
        else:
            busy = bc > args.max_load or (first and la[0] > args.max_load)
        if not busy:
            return {"busy_cores_pre": round(bc, 3), "waited_s": round(time.time() - t0, 1), "busy_at_start": False}
        msg = f"box busy: {bc:.2f} cores used by others, loadavg {la}"
        if args.on_busy == "refuse":
            die(msg + " (--on-busy refuse)")
        if args.on_busy == "skip" and time.time() - t0 > args.wait_max_s:
            log("box still busy after --wait-max-s: skipping this run (--on-busy skip)")
            return None
        if args.on_busy == "warn" or time.time() - t0 > args.wait_max_s:
            log("WARNING: " + msg + " - measuring anyway, row will carry busy_at_start=true")
            return {"busy_cores_pre": round(bc, 3), "waited_s": round(time.time() - t0, 1), "busy_at_start": True}
        log(msg + f" - waiting (up to {args.wait_max_s} s)")
        time.sleep(10)


# ----------------------------------------------------------------------------------------------
# Step 3: bandwidth
# ----------------------------------------------------------------------------------------------
STREAM_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
/* STREAM-like: arrays far larger than the 300 MB L3; best of NTRIES; bytes counted as
   read: 8N, copy: 16N (read+write, no write-allocate counted), triad: 24N. */
static double now(void){ return omp_get_wtime(); }
int main(int argc, char **argv){
  size_t n = (size_t)atoll(argv[1]); int ntries = atoi(argv[2]);
  double *a = aligned_alloc(64, n*8), *b = aligned_alloc(64, n*8), *c = aligned_alloc(64, n*8);
  #pragma omp parallel for schedule(static)
  for (size_t i=0;i<n;i++){ a[i]=1.0; b[i]=2.0; c[i]=0.0; }
  double best_read=1e30, best_copy=1e30, best_triad=1e30, sink=0;
  for (int t=0;t<ntries;t++){
    double t0=now(), s=0;
    #pragma omp parallel for simd reduction(+:s) schedule(static)
    for (size_t i=0;i<n;i++) s += a[i];  /* simd: lets gcc vectorize the sum without -ffast-math */
    double t1=now(); sink+=s; if(t1-t0<best_read) best_read=t1-t0;
    t0=now();
    #pragma omp parallel for schedule(static)
    for (size_t i=0;i<n;i++) c[i]=a[i];
    t1=now(); if(t1-t0<best_copy) best_copy=t1-t0;
    t0=now();
    #pragma omp parallel for schedule(static)
    for (size_t i=0;i<n;i++) a[i]=b[i]+3.0*c[i];
    t1=now(); if(t1-t0<best_triad) best_triad=t1-t0;
  }
  printf("{\"threads\": %d, \"n_doubles\": %zu, \"read_GBps\": %.3f, \"copy_GBps\": %.3f, \"triad_GBps\": %.3f, \"sink\": %g}\n",
    omp_get_max_threads(), n, 8.0*n/best_read/1e9, 16.0*n/best_copy/1e9, 24.0*n/best_triad/1e9, sink);
  return 0;
}
"""


def step_bandwidth(args) -> dict:
    out = args.work / "bandwidth.json"
    if out.exists() and not args.redo_bandwidth:
        log(f"bandwidth: already measured ({out})")
        return json.loads(out.read_text())
    bdir = args.work / "stream"
    bdir.mkdir(exist_ok=True)
    (bdir / "stream.c").write_text(STREAM_C)
    run(["cc", "-O3", "-march=native", "-fopenmp", "-o", bdir / "stream", bdir / "stream.c"])
    res = {"method": "C STREAM-like (stream.c in this script), 3 arrays of %d MiB float64, best of %d tries, "
                     "gcc -O3 -march=native -fopenmp, OMP_PROC_BIND=close; read=8N B, copy=16N B, triad=24N B "
                     "(write-allocate traffic not counted)" % (args.bw_mib, args.bw_tries),
           "runs": []}
    n = args.bw_mib * 1024 * 1024 // 8
    for th in args.threads:
        gate = wait_quiet(args, first=True)
        if gate is None:
            continue
        la0 = loadavg()
        env = dict(os.environ, OMP_NUM_THREADS=str(th), OMP_PROC_BIND="close")
        r = subprocess.run([str(bdir / "stream"), str(n), str(args.bw_tries)], env=env, capture_output=True,
                           text=True, check=True)
        rec = json.loads(r.stdout)
        rec.update(gate, loadavg_before=la0, loadavg_after=loadavg(),
                   timestamp=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
        res["runs"].append(rec)
        log(f"bandwidth t={th}: read {rec['read_GBps']} GB/s, copy {rec['copy_GBps']}, triad {rec['triad_GBps']}")
    if len(res["runs"]) < len(args.threads):
        log("bandwidth: not all thread counts measured (box busy) - bandwidth.json not written")
        return res
    out.write_text(json.dumps(res, indent=2))
    return res


# ----------------------------------------------------------------------------------------------
# Step 4: llama-bench
# ----------------------------------------------------------------------------------------------
def step_bench(args, build: dict, manifest: dict) -> list:
    bench = args.work / "build" / "bin" / "llama-bench"
    rawdir = args.work / "raw"
    rawdir.mkdir(exist_ok=True)
    records = []
    first = True
    todo = []
    for name in args.models:
        m = MODELS[name]
        for prec in PRECISIONS[name]:
            if args.precisions and prec not in args.precisions:
                continue
            p = gguf_path(args.work, name, m, prec)
            if not p.exists():
                log(f"bench: {p.name} missing, skipped (run the gguf step)")
                continue
            for th in args.threads:
                todo.append((name, m, prec, p, th))
    for idx, (name, m, prec, p, th) in enumerate(todo, 1):
        raw = rawdir / f"{p.stem}-t{th}.json"
        old = json.loads(raw.read_text()) if raw.exists() else None
        doc = old
        redo = old is None or args.redo_bench or (
            args.redo_invalid and (old["busy_at_start"] or old["foreign_cores_during"] > args.max_load))
        gate = None
        if redo:
            if old is not None:
                log(f"bench: {raw.name} exists (others used {old['foreign_cores_during']} cores then) - redoing")
            gate = wait_quiet(args, first)
            if gate is None and old is None:
                continue
        if gate is not None:
            first = False
            la0 = loadavg()
            ts0 = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
            cmd = [str(bench), "-m", str(p), "-t", str(th), "-p", str(args.n_prompt), "-n", str(args.n_gen),
                   "-r", str(args.reps), "-lm", "mmap", "-o", "json"]
            log(f"bench [{idx}/{len(todo)}] {p.name} t={th}  (busy cores before: {gate['busy_cores_pre']}, "
                f"loadavg {la0})")
            ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            b0, st0 = cpu_jiffies()
            t0 = time.time()
            r = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.time() - t0
            b1, st1 = cpu_jiffies()
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            if r.returncode != 0:
                (rawdir / f"{p.stem}-t{th}.err").write_text(r.stderr)
                log(f"ERROR: llama-bench failed ({r.returncode}) on {p.name}; stderr in raw/{p.stem}-t{th}.err")
                continue
            own = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
            box = (b1 - b0) / HZ
            doc = {"cmd": cmd, "llama_bench": json.loads(r.stdout), "stderr_tail": r.stderr[-4000:],
                   "timestamp_start": ts0, "wall_s": round(wall, 2), "loadavg_before": la0,
                   "loadavg_after": loadavg(), "own_cpu_s": round(own, 2), "box_cpu_s": round(box, 2),
                   "foreign_cores_during": round(max(0.0, box - own) / wall, 3),
                   "steal_cores_during": round((st1 - st0) / HZ / wall, 3), **gate}
            if old is not None:  # keep the run this one replaces
                (rawdir / "superseded").mkdir(exist_ok=True)
                raw.rename(rawdir / "superseded" / f"{raw.stem}-{int(time.time())}.json")
            raw.write_text(json.dumps(doc, indent=2))
            log("   -> " + ", ".join(f"{'pp' if t['n_prompt'] else 'tg'} {t['avg_ts']:.2f}±{t['stddev_ts']:.2f} t/s"
                                      for t in doc["llama_bench"]) +
                f"; others used {doc['foreign_cores_during']} cores during the run ({wall:.0f} s)")
        info = manifest.get(p.name, {})
        for t in doc["llama_bench"]:
            records.append({
                "model": name, "arch": m["arch"], "layers": m["layers"], "real_layers": m["real_layers"],
                "dense_layers": m.get("dense_layers", 0), "n_experts": m["experts"], "top_k": m["top_k"],
                "shared_experts": m.get("shared_experts", 0), "hidden": m["hidden"], "expert_ffn": m["expert_ffn"],
                "heads": m["heads"], "kv_heads": m["kv_heads"], "head_dim": m["head_dim"], "vocab": m["vocab"],
                "precision": prec, "file_type": info.get("file_type_name"),
                "expert_tensor_types": "+".join(info.get("expert_tensor_types", [])),
                "tensor_types": ";".join(f"{k}:{v['n']}:{v['bytes']}" for k, v in info.get("tensor_types", {}).items()),
                "file": p.name, "file_bytes": p.stat().st_size,
                "model_size_llama": t["model_size"], "model_n_params": t["model_n_params"],
                "threads": t["n_threads"], "test": "pp" if t["n_prompt"] > 0 else "tg",
                "n_prompt": t["n_prompt"], "n_gen": t["n_gen"], "n_batch": t["n_batch"], "n_ubatch": t["n_ubatch"],
                "avg_ts": t["avg_ts"], "stddev_ts": t["stddev_ts"], "samples_ts": t["samples_ts"],
                "repetitions": len(t["samples_ts"]), "flash_attn": t.get("flash_attn"), "load_mode": t.get("load_mode"),
                "repack": t.get("repack"), "type_k": t["type_k"], "type_v": t["type_v"],
                "llama_cpp_commit": t["build_commit"], "llama_cpp_build_number": t["build_number"],
                "llama_cpp_python_sdist": build.get("llama_cpp_python"), "cpu_info": t["cpu_info"],
                "backends": t["backends"],
                "loadavg_1m_before": doc["loadavg_before"][0], "loadavg_1m_after": doc["loadavg_after"][0],
                "loadavg_before": doc["loadavg_before"], "loadavg_after": doc["loadavg_after"],
                "busy_cores_before": doc["busy_cores_pre"], "foreign_cores_during": doc["foreign_cores_during"],
                "steal_cores_during": doc.get("steal_cores_during"), "bench_wall_s": doc["wall_s"],
                "busy_at_start": doc["busy_at_start"],
                "valid": (not doc["busy_at_start"]) and doc["foreign_cores_during"] <= args.max_load,
                "timestamp": t["test_time"], "host": platform.node(),
            })
    return records


def write_results(args, records: list) -> None:
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "llamacpp-measured.json").write_text(json.dumps(records, indent=1))
    cols = [k for k in records[0] if k not in ("samples_ts", "loadavg_before", "loadavg_after")] + ["samples_ts"]
    with open(out / "llamacpp-measured.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        wr.writeheader()
        for r in records:
            row = dict(r)
            row["samples_ts"] = " ".join(f"{x:.4f}" for x in r["samples_ts"])
            wr.writerow(row)
    log(f"wrote {len(records)} rows to {out/'llamacpp-measured.json'} and .csv")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="work dir (sources, build, gguf, raw results)")
    ap.add_argument("--out-dir", type=Path, default=None, help="where the results files go (default: --work)")
    ap.add_argument("--steps", default="build,gguf,bandwidth,bench",
                    help="comma list of build,gguf,bandwidth,bench (default: all)")
    ap.add_argument("--llama-cpp-python", default=LLAMA_CPP_PYTHON_VERSION, help="sdist version to build")
    ap.add_argument("--jobs", type=int, default=2, help="build parallelism")
    ap.add_argument("--native", action="store_true",
                    help="build with GGML_NATIVE=ON instead of the explicit AVX-512 list (enables AMX where the CPU has it)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of " + ",".join(MODELS))
    ap.add_argument("--precisions", default="", help="comma list to restrict precisions (default: all per model)")
    ap.add_argument("--quant-threads", type=int, default=2)
    ap.add_argument("--threads", default="1,2", help="llama-bench thread counts, comma list")
    ap.add_argument("--n-prompt", type=int, default=64)
    ap.add_argument("--n-gen", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-load", type=float, default=0.5,
                    help="max CPU cores used by others (and 1-min loadavg before the first run) (default 0.5)")
    ap.add_argument("--gate", choices=["sample", "loadavg"], default="sample",
                    help="sample: /proc/stat busy cores before each run (+ 1-min loadavg before the first); "
                         "loadavg: 1-min load average before every run (default: sample)")
    ap.add_argument("--on-busy", choices=["wait", "warn", "skip", "refuse"], default="wait",
                    help="when the box is busy: wait (then measure and flag after --wait-max-s), warn (measure and "
                         "flag at once), skip (wait up to --wait-max-s, then leave that run out), refuse (stop)")
    ap.add_argument("--wait-max-s", type=float, default=300.0, help="with --on-busy wait: give up waiting after this")
    ap.add_argument("--sample-s", type=float, default=3.0, help="seconds of /proc/stat sampling before each run")
    ap.add_argument("--bw-mib", type=int, default=1024, help="MiB per array for the bandwidth test (3 arrays)")
    ap.add_argument("--bw-tries", type=int, default=5)
    ap.add_argument("--redo-bench", action="store_true", help="re-run llama-bench even if raw results exist")
    ap.add_argument("--redo-invalid", action="store_true",
                    help="re-run llama-bench where the stored raw result was measured on a busy box")
    ap.add_argument("--redo-bandwidth", action="store_true")
    args = ap.parse_args()
    args.work = args.work.resolve()
    args.out_dir = (args.out_dir or args.work).resolve()
    args.models = [x for x in args.models.split(",") if x]
    for x in args.models:
        if x not in MODELS:
            die(f"unknown model {x}; known: {', '.join(MODELS)}")
    args.precisions = [x for x in args.precisions.split(",") if x]
    args.threads = [int(x) for x in args.threads.split(",")]
    steps = set(args.steps.split(","))
    bad = steps - {"build", "gguf", "bandwidth", "bench"}
    if bad:
        die(f"unknown steps {bad}")
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "logs").mkdir(exist_ok=True)

    build = step_build(args) if "build" in steps else json.loads((args.work / "build-info.json").read_text())
    manifest = step_gguf(args, build) if "gguf" in steps else json.loads(
        (args.work / "gguf-manifest.json").read_text() if (args.work / "gguf-manifest.json").exists() else "{}")
    if "bandwidth" in steps:
        step_bandwidth(args)
    if "bench" in steps:
        recs = step_bench(args, build, manifest)
        if recs:
            write_results(args, recs)
        else:
            log("no benchmark rows")


if __name__ == "__main__":
    main()
