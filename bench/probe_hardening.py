"""Probe the CLI as a hostile user would, in four groups (`--group`): `errors`, the 14 traceback
classes and 6 silent-wrong classes of hostile inputs; `files`, damaged planner folders, non-atomic
writes and unclear errors; `study`, a user study's importers that counted wrongly without a word,
foreign files named as another format's parse error, caches that failed a run and the missing test
extra (a probe whose input is legal checks the result it imports); `box`, a user's question on one
RTX 4090 (run option values reaching code unchecked, refusals whose advice is refused in turn, noise
on a normal run, the box's price in search); each with one or more concrete inputs. Prints one row
per probe and the counts per kind.

    python bench/probe_hardening.py            # all probes (~2 min on 2 cores)
    python bench/probe_hardening.py --skip-slow  # without the recording, fitting and kill probes
    python bench/probe_hardening.py --group files  # planner folders, non-atomic writes, unclear errors
    python bench/probe_hardening.py --group study  # the user study's: importers, foreign files, caches, extras
    python bench/probe_hardening.py --group box    # unchecked values, advice, noise, prices (~3 min)

A probe of a *traceback* class passes when casmoe exits 2 with one `casmoe: error:` line and no
traceback (and leaves no partial file). A *non-atomic* probe passes when an interrupted or
failed write leaves the old output whole (or none) and nothing mixed is accepted; an *unclear*
probe when the input is accepted with the right result, or refused in one line that names
what to fix (and, where it says so, before the work or within seconds). A probe of a *silent-wrong* class passes when casmoe
refuses the input (exit 2, one line) or, for the kill probes, leaves no partial output.
Every run is capped at 4 GiB of address space, so a would-be MemoryError shows in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "traces" / "tiny-mixtral.npz"
MEM_CAP = 4 * 2**30
MOUNTS = {"full": "size=64k", "ro": "ro,size=64k"}
"""Folders a probe's arguments may write under: a full disk, a read-only file system."""


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEM_CAP, MEM_CAP))
    os.setsid()


def run(args: list[str], cwd: Path, timeout: float = 180, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(cwd), **(env or {})}
    start = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "casmoe", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
            env=full_env, preexec_fn=_limits,
        )
    except subprocess.TimeoutExpired as exc:
        p = subprocess.CompletedProcess(args, 124, exc.stdout or "", (exc.stderr or "") + "\n[timeout]")
    p.elapsed = time.perf_counter() - start  # type: ignore[attr-defined]
    return p


@dataclass
class Probe:
    klass: str  # "traceback: ..." or "silent: ..."
    name: str
    args: list[str] = field(default_factory=list)
    setup: Callable[[Path], None] | None = None
    check: Callable[[subprocess.CompletedProcess, Path], str] | None = None  # "" = passed, else what went wrong
    slow: bool = False
    env: dict[str, str] | None = None
    runner: Callable[[Path], str] | None = None  # a probe that is not one command: "" = passed


def one_line_error(p: subprocess.CompletedProcess, _: Path) -> str:
    err = p.stderr.strip().splitlines()
    if "Traceback" in p.stderr or p.returncode not in (0, 2):
        last = err[-1] if err else ""
        return f"traceback/exit {p.returncode}: {last[:90]}"
    if p.returncode == 0:
        return "accepted (exit 0)"
    errors = [ln for ln in err if ln.startswith("casmoe: error:")]
    if len(errors) != 1:
        return f"exit 2 but {len(errors)} error lines"
    return ""


def refused(p: subprocess.CompletedProcess, d: Path) -> str:
    return one_line_error(p, d)


def no_traceback(p: subprocess.CompletedProcess, d: Path) -> str:
    """Either answer is fine (a huge cache holds every expert); a traceback or a crash is not."""
    bad = one_line_error(p, d)
    return "" if bad == "accepted (exit 0)" else bad


def no_tmp_left(check: Callable) -> Callable:
    def inner(p: subprocess.CompletedProcess, d: Path) -> str:
        bad = check(p, d)
        orphans = [f.name for f in d.rglob("*.tmp")] + [f.name for f in d.rglob(".*.tmp*")]
        return bad or (f"left {orphans[:3]}" if orphans else "")

    return inner


# ---- inputs ----------------------------------------------------------------------------------

def write(rel: str, text: str | bytes) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        (p.write_bytes if isinstance(text, bytes) else p.write_text)(text)

    return setup


def chain(*fns: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        for f in fns:
            f(d)

    return setup


def user_policy(body: str) -> Callable[[Path], None]:
    return write("userpol.py", "from casmoe.policies.lru import LRU\n\nclass P(LRU):\n    name = 'p'\n" + body)


def hardware(**changes: str) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        text = (REPO / "casmoe" / "sim" / "box" / "profiles" / "rtx4090x4.toml").read_text()
        lines = []
        for ln in text.splitlines():
            key = ln.split("=", 1)[0].strip()
            if key in changes and not ln.startswith("[") and "sources" not in ln and lines.count("[sources]") == 0:
                ln = f"{key} = {changes[key]}"
            lines.append(ln)
        (d / "hw.toml").write_text("\n".join(lines) + "\n")

    return setup


def small_trace(d: Path, name: str = "t.npz", hidden: int = 0, **arrays) -> None:
    from casmoe.geometry import Geometry
    from casmoe.synthetic import SynthConfig, generate
    from casmoe.trace_io import save_trace

    g = Geometry(4, 8, 2, hidden=hidden, intermediate=hidden)
    tr = generate(g, SynthConfig(requests=3, prefill=(2, 4), decode=(3, 5), seed=0))
    tr.meta.pop("model_preset", None)
    save_trace(tr, d / name)
    if arrays:
        with np.load(d / name) as npz:
            data = {k: npz[k] for k in npz.files}
        data.update(arrays)
        np.savez(d / name, **data)


def npz_meta(d: Path, change: Callable[[dict], None], name: str = "t.npz") -> None:
    small_trace(d, name)
    with np.load(d / name) as npz:
        data = {k: npz[k] for k in npz.files}
    meta = json.loads(data["meta"].tobytes())
    change(meta)
    data["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(d / name, **data)


def csv_text(n_layer: str = "2", rows: str = "0,1,0,0,0,1,0.5\n0,1,0,0,1,2,0.5\n0,1,0,1,0,3,0.5\n0,1,0,1,1,0,0.5\n",
             extra: str = "") -> str:
    return (f"# route_trace v1\n# model=x n_layer={n_layer} n_expert=4 n_expert_used=2\n{extra}"
            "turn,phase,step,layer,slot,expert,weight\n" + rows)


def json_trace(**top) -> str:
    doc = {"num_experts": 4, "top_k": 2, "requests": [{"layers": [[[0, 1], [2, 3]]]}]}
    doc.update(top)
    return json.dumps(doc)


def uint64_offsets(d: Path) -> None:
    """Two requests whose offsets [0, n + 5, n] go backwards; stored as uint64 the difference
    wraps to a huge positive number instead of a negative one."""
    small_trace(d)
    with np.load(d / "t.npz") as npz:
        data = {k: npz[k] for k in npz.files}
    n = len(data["topk"])
    data["offsets"] = np.array([0, n + 5, n], dtype=np.uint64)
    data["prefill"] = np.array([1, 0], dtype=np.int64)
    meta = json.loads(data["meta"].tobytes())
    meta["requests"] = meta["requests"][:2]
    data["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(d / "t.npz", **data)


def zero_bytes_trace(d: Path) -> None:
    """Mixtral's routing shape with every expert size recorded as 0 bytes."""
    from casmoe.trace_io import load_trace, save_trace

    tr = load_trace(TRACE).subset(range(2))
    g = tr.geometry
    from dataclasses import replace

    tr.geometry = replace(g, hidden=0, intermediate=0, layer_expert_bytes=(0,) * g.layers)
    save_trace(tr, d / "t.npz")


def check_partial_csv(p: subprocess.CompletedProcess, d: Path) -> str:
    if (d / "out.csv").exists():
        reimport = run(["trace", "import", str(d / "out.csv"), "-o", str(d / "back.npz")], d)
        return f"partial out.csv left at the final path (re-import exit {reimport.returncode})"
    return ""


def kill_export(d: Path) -> subprocess.CompletedProcess:
    """Start `trace export` of the big shipped trace and SIGKILL it mid-write."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "casmoe", "trace", "export", str(REPO / "traces" / "tiny-olmoe.npz"), str(d / "out.csv")],
        cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_limits,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    deadline = time.time() + 60
    while time.time() < deadline and not any(d.glob("*out.csv*")):
        time.sleep(0.05)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGKILL)
    out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def kill_sweep(d: Path) -> subprocess.CompletedProcess:
    """SIGKILL a sweep's main process; its workers must not outlive it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "casmoe", "sweep", "--trace", str(TRACE), "--requests", "40", "--policy", "lru",
         "--policy", "belady", "--policy", "lfu", "--capacity", "2", "--capacity", "3", "--capacity", "4",
         "--jobs", "2", "--out", str(d / "sw")],
        cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    kids: list[str] = []
    deadline = time.time() + 60
    while time.time() < deadline and len(kids) < 2:
        time.sleep(0.5)
        kids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    time.sleep(2.0)  # the workers are busy with points
    if not kids:
        proc.kill()
        return subprocess.CompletedProcess(proc.args, 1, "", "setup: the sweep started no workers")
    proc.kill()
    proc.wait()
    time.sleep(3.0)
    alive = [k for k in kids if Path(f"/proc/{k}").exists()
             and "zombie" not in Path(f"/proc/{k}/status").read_text().lower()]
    for k in alive:
        os.kill(int(k), signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, 0 if not alive else 1, "", f"{len(alive)} of {len(kids)} workers alive")


# ---- the probes ------------------------------------------------------------------------------

T = ["--trace", str(TRACE)]
TB = "traceback"
SW = "silent"


def probes() -> list[Probe]:
    sim = ["simulate", *T, "--requests", "2", "--out", "o"]
    rep = ["replay", *T]
    return [
        # 1. policy options passed unchecked to constructors
        Probe(f"{TB} 1 policy options", "lru[foo=1]", rep + ["--policy", "lru[foo=1]"]),
        Probe(f"{TB} 1 policy options", "sch[m=0]", rep + ["--policy", "sch[m=0]"]),
        Probe(f"{TB} 1 policy options", "static[profile=other shape]", rep + ["--policy", "static[profile=o.npz]"],
              setup=lambda d: small_trace(d, "o.npz")),
        Probe(f"{TB} 1 policy options", "casmoe[noise=abc]", rep + ["--policy", "casmoe[predictor=noisy,noise=abc]"]),
        # 2. user-policy faults
        Probe(f"{TB} 2 user policy", "prefetch out of range", rep + ["--policy", "userpol:P"],
              setup=user_policy("    def prefetch_layer(self, step, layer):\n        return [10**6]\n")),
        Probe(f"{TB} 2 user policy", "module raises on import", rep + ["--policy", "userpol:P"],
              setup=write("userpol.py", "raise RuntimeError('boom')\n")),
        Probe(f"{TB} 2 user policy", "SyntaxError", rep + ["--policy", "userpol:P"], setup=write("userpol.py", "def (:\n")),
        Probe(f"{TB} 2 user policy", "':X' spec", rep + ["--policy", ":X"]),
        Probe(f"{TB} 2 user policy", "victim raises", rep + ["--policy", "userpol:P", "--capacity", "2"],
              setup=user_policy("    def victim(self, layer, candidates):\n        raise KeyError('no')\n")),
        Probe(f"{TB} 2 user policy", "prefetch returns None", rep + ["--policy", "userpol:P"],
              setup=user_policy("    def prefetch_layer(self, step, layer):\n        return None\n")),
        Probe(f"{TB} 2 user policy", "float ids", rep + ["--policy", "userpol:P"],
              setup=user_policy("    def prefetch_layer(self, step, layer):\n        return [1.5]\n")),
        Probe(f"{TB} 2 user policy", "victim returns a non-candidate", rep + ["--policy", "userpol:P", "--capacity", "2"],
              setup=user_policy("    def victim(self, layer, candidates):\n        return 'x'\n")),
        # 3. --planner FILE
        Probe(f"{TB} 3 planner file", "--planner FILE", rep + ["--policy", "casmoe", "--planner", "f.txt"],
              setup=write("f.txt", "x")),
        # 4. hardware TOML
        Probe(f"{TB} 4 hardware TOML", "memory nan", sim + ["--hardware", "hw.toml"], setup=hardware(memory_gib="nan")),
        Probe(f"{TB} 4 hardware TOML", "memory inf", sim + ["--hardware", "hw.toml"], setup=hardware(memory_gib="inf")),
        Probe(f"{TB} 4 hardware TOML", "non-UTF-8 bytes", sim + ["--hardware", "hw.toml"],
              setup=write("hw.toml", b"name = \"\xff\xfe\"\n")),
        # 5. zero expert bytes
        Probe(f"{TB} 5 zero expert bytes", "simulate a trace of 0-byte experts",
              ["simulate", "--trace", "t.npz", "--out", "o"], setup=zero_bytes_trace),
        Probe(f"{TB} 5 zero expert bytes", "24GB on a trace without sizes",
              ["replay", "--trace", "t.npz", "--capacity", "24GB"], setup=lambda d: small_trace(d)),
        # 6. huge sizes
        Probe(f"{TB} 6 huge sizes", "--capacity 1e12", rep + ["--policy", "lru", "--capacity", "1000000000000"],
              check=no_traceback),
        Probe(f"{TB} 6 huge sizes", "simulate --capacity 1e12", sim + ["--policy", "lru", "--capacity", "1000000000000"],
              check=no_traceback),
        Probe(f"{TB} 6 huge sizes", "CSV n_layer=99999999999", ["trace", "import", "x.csv", "-o", "x.npz"],
              setup=write("x.csv", csv_text(n_layer="99999999999"))),
        Probe(f"{TB} 6 huge sizes", "JSON num_experts 1e12", ["trace", "import", "x.json", "-o", "x.npz"],
              setup=write("x.json", json_trace(num_experts=10**12))),
        Probe(f"{TB} 6 huge sizes", "metadata experts=1e9", ["replay", "--trace", "t.npz", "--policy", "lru"],
              setup=lambda d: npz_meta(d, lambda m: m["geometry"].update(experts=10**9))),
        Probe(f"{TB} 6 huge sizes", "CSV step 1e10", ["trace", "import", "x.csv", "-o", "x.npz"],
              setup=write("x.csv", csv_text(rows="0,1,9999999999,0,0,1,0.5\n"))),
        # 7. JSON Infinity / deep nesting
        Probe(f"{TB} 7 JSON numbers", "Infinity", ["trace", "import", "x.json", "-o", "x.npz"],
              setup=write("x.json", json_trace().replace('"top_k": 2', '"top_k": Infinity'))),
        Probe(f"{TB} 8 JSON nesting", "deep nesting", ["trace", "import", "x.json", "-o", "x.npz"],
              setup=write("x.json", "[" * 100000 + "]" * 100000)),
        # 9. simulate --out EXISTING_FILE
        Probe(f"{TB} 9 output paths", "simulate --out FILE", sim + ["--policy", "lru", "--capacity", "4"],
              setup=write("o", "i am a file")),
        # 10. trace synth DIR / export DIR
        Probe(f"{TB} 10 output is a dir", "trace synth DIR", ["trace", "synth", "adir", "--requests", "2"],
              setup=lambda d: (d / "adir").mkdir()),
        Probe(f"{TB} 10 output is a dir", "trace export DIR", ["trace", "export", str(TRACE), "adir"],
              setup=lambda d: (d / "adir").mkdir()),
        # 11. bench --mmap nodir/x, --device nope
        Probe(f"{TB} 11 backend paths", "calibrate --out nodir/x.toml",  # (bench --mmap is gone)
              ["calibrate", "backend", "--model", "tiny-mixtral", "--out", "nodir/x.toml", "--threads", "1"], slow=True),
        Probe(f"{TB} 12 bench device", "bench --device nope",
              ["bench", "--model", "tiny-mixtral", "--num-prompts", "1", "--max-new-tokens", "2", "--device", "nope",
               "--threads", "1"], slow=True),
        # 13. ENOSPC (a 64 KiB tmpfs at ./full, mounted by main() when possible)
        Probe(f"{TB} 13 disk full", "trace export to a full disk", ["trace", "export", str(TRACE), "full/x.csv"],
              check=no_tmp_left(one_line_error)),
        Probe(f"{TB} 13 disk full", "trace synth to a full disk", ["trace", "synth", "full/x.npz", "--requests", "50"],
              check=no_tmp_left(one_line_error)),
        Probe(f"{TB} 13 disk full", "simulate --out on a full disk",
              sim[:-1] + ["full/sim", "--policy", "lru", "--capacity", "4"], check=no_tmp_left(one_line_error)),
        # 14. 0-d topk
        Probe(f"{TB} 14 0-d topk", "0-d topk array", ["trace", "info", "t.npz"],
              setup=lambda d: small_trace(d, topk=np.array(3, dtype=np.int16))),
        # silent wrong results
        Probe(f"{SW} 1 NaN hardware", "h2d_pinned_gbs = nan", sim + ["--hardware", "hw.toml", "--policy", "lru"],
              setup=hardware(h2d_pinned_gbs="nan"), check=refused),
        Probe(f"{SW} 1 NaN hardware", "copy_latency_us = nan", sim + ["--hardware", "hw.toml", "--policy", "lru"],
              setup=hardware(copy_latency_us="nan"), check=refused),
        Probe(f"{SW} 1 NaN hardware", "layer_overhead_us = nan", sim + ["--hardware", "hw.toml", "--policy", "lru"],
              setup=hardware(layer_overhead_us="nan"), check=refused),
        Probe(f"{SW} 2 negative ids", "prefetch of -1", rep + ["--policy", "userpol:P"],
              setup=user_policy("    def prefetch_layer(self, step, layer):\n        return [-1]\n"), check=refused),
        Probe(f"{SW} 3 uint64 offsets", "offsets wrap", ["trace", "info", "t.npz"], setup=uint64_offsets, check=refused),
        Probe(f"{SW} 4 importer coercion", "num_experts 16.7", ["trace", "import", "x.json", "-o", "x.npz"],
              setup=write("x.json", json_trace(num_experts=16.7)), check=refused),
        Probe(f"{SW} 4 importer coercion", "top_k \"2\"", ["trace", "import", "x.json", "-o", "x.npz"],
              setup=write("x.json", json_trace(top_k="2")), check=refused),
        Probe(f"{SW} 4 importer coercion", "top_k 2.5", ["trace", "import", "x.json", "-o", "x.npz"],
              setup=write("x.json", json_trace(top_k=2.5)), check=refused),
        Probe(f"{SW} 4 importer coercion", "prefill true", ["trace", "import", "x.json", "-o", "x.npz"],
              setup=write("x.json", json.dumps({"num_experts": 4, "top_k": 2,
                                                "requests": [{"layers": [[[0, 1], [2, 3]]], "prefill": True}]})),
              check=refused),
        Probe(f"{SW} 4 importer coercion", "CSV cut mid-row", ["trace", "import", "x.csv", "-o", "x.npz"],
              setup=write("x.csv", csv_text(rows="0,1,0,0,0,1,0.5\n0,1,0,0,1,2,0.5\n0,1,0,1,0,3,0.5\n0,1,0,1,1,0,0.1")),
              check=refused),
        Probe(f"{SW} 4 importer coercion", "casmoe request= for a turn without rows",
              ["trace", "import", "x.csv", "-o", "x.npz"],
              setup=write("x.csv", csv_text(extra='# casmoe request={"turn": 7}\n')), check=refused),
        Probe(f"{SW} 5 record resume", "resume with another --max-prompt-tokens", [], slow=True),
        Probe(f"{SW} 6 killed export", "SIGKILLed trace export", [], check=check_partial_csv, slow=True),
        Probe(f"{SW} 6 killed sweep", "SIGKILLed sweep leaves workers", [], slow=True,
              check=lambda p, d: "" if p.returncode == 0 else p.stderr),
    ]


# ---- files: planner folders, non-atomic writes, unclear errors -------------------------------------

def planner_folder(d: Path, name: str = "p", seed: int = 0, prompts: int = 12) -> None:
    """A planner for small_trace's geometry from parts (random keys and patterns, an untrained
    predictor) through the library's own save: no sentence model, no training."""
    from casmoe.geometry import Geometry
    from casmoe.planner import EAPConfig, Planner, PlannerConfig
    from casmoe.planner.eam import EMBED_DIM, Matcher
    from casmoe.planner.eap import EAP, EAPNet
    from casmoe.planner.fitdata import FitData
    from casmoe.synthetic import SynthConfig, generate

    g, rng = Geometry(4, 8, 2), np.random.default_rng(seed)
    patterns = rng.random((prompts, g.layers, g.experts)).astype(np.float32)
    patterns /= patterns.sum(-1, keepdims=True)
    cfg = PlannerConfig(eap=EAPConfig(hidden=16, layers=1, heads=2, intermediate=16, head_hidden=8, max_len=8))
    vocab = np.arange(100, 120, dtype=np.int64)
    trace = generate(g, SynthConfig(requests=3, prefill=(2, 4), decode=(3, 5), seed=seed))
    for i, r in enumerate(trace.requests):
        r.prompt, r.task = f"prompt {i}", "t"
    matcher = Matcher.build(rng.normal(size=(prompts, EMBED_DIM)).astype(np.float32), patterns, 5, seed)
    predictor = EAP(EAPNet(cfg.eap, len(vocab) + 2, g.layers, g.experts), vocab, cfg.eap)
    Planner(g, cfg, matcher, predictor, FitData.of(trace, trace, patterns[:3])).save(d / name)


def planner_folder_v2(d: Path, name: str = "p") -> None:
    """Today's default kind of planner for small_trace's geometry (ridge predictor, confidence
    gate, trajectory stage) from parts, through the library's own save."""
    from casmoe.geometry import Geometry
    from casmoe.planner import EAPConfig, Planner, PlannerConfig
    from casmoe.planner.eam import EMBED_DIM, Matcher
    from casmoe.planner.fitdata import FitData
    from casmoe.planner.gate import ConfidenceGate
    from casmoe.planner.linear import LinearEAP
    from casmoe.planner.trajectory import fit_trajectory
    from casmoe.synthetic import SynthConfig, generate

    g, rng = Geometry(4, 8, 2), np.random.default_rng(0)
    keys = rng.normal(size=(12, EMBED_DIM)).astype(np.float32)
    patterns = rng.random((12, g.layers, g.experts)).astype(np.float32)
    patterns /= patterns.sum(-1, keepdims=True)
    trace = generate(g, SynthConfig(requests=6, prefill=(2, 4), decode=(4, 6), seed=0))
    for i, r in enumerate(trace.requests):
        r.prompt, r.task = f"prompt {i}", "t"
    cfg = PlannerConfig(eap=EAPConfig(kind="linear"))
    Planner(g, cfg, Matcher.build(keys, patterns, 5, 0), LinearEAP.fit(keys, patterns),
            FitData.of(trace, trace, patterns[:6]), ConfidenceGate(np.zeros(0), np.array([0.5])),
            fit_trajectory(trace, None, horizon=2)).save(d / name)


def damaged_planner(change: Callable[[Path], None], build: Callable[[Path], None] = planner_folder,
                    manifest: bool = True) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        small_trace(d)
        build(d)
        change(d / "p")
        if not manifest:  # a folder from before manifests (or a user who deleted it): each file's own checks
            (d / "p" / "manifest.json").unlink()

    return setup


def truncate(name: str) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: len(data) // 2])

    return change


def planner_json(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        meta = json.loads((folder / "planner.json").read_text())
        edit(meta)
        (folder / "planner.json").write_text(json.dumps(meta))

    return change


def index_of_dim(folder: Path) -> None:
    import hnswlib

    index = hnswlib.Index(space="cosine", dim=16)
    index.init_index(max_elements=12)
    index.add_items(np.random.default_rng(0).random((12, 16), dtype=np.float32))
    index.save_index(str(folder / "eam.index"))


def prompt_trace(d: Path) -> None:
    """small_trace with a prompt per request (what `planner fit` learns from)."""
    from casmoe.trace_io import load_trace, save_trace

    small_trace(d)
    tr = load_trace(d / "t.npz")
    for i, r in enumerate(tr.requests):
        r.prompt = f"a question about topic {i}"
    save_trace(tr, d / "t.npz")


def no_partial_folder(folder: str) -> Callable[[subprocess.CompletedProcess, Path], str]:
    """A one-line error and no folder left half written (an absent folder is fine)."""
    def check(p: subprocess.CompletedProcess, d: Path) -> str:
        bad = no_tmp_left(one_line_error)(p, d)
        left = sorted(f.name for f in (d / folder).iterdir()) if (d / folder).is_dir() else []
        return bad or (f"left a partial folder: {left}" if left else "")

    return check


def killed_planner_save(d: Path) -> subprocess.CompletedProcess:
    """Save planner B over planner A and SIGKILL the writer once the matcher's files are written
    (the predictor's save never returns); then serve from the folder. It must be A whole (or a
    one-line refusal), never B's index and patterns beside A's predictor and planner.json."""
    small_trace(d)
    planner_folder(d)
    before = {f.name: f.read_bytes() for f in (d / "p").iterdir()}
    code = (
        "import os, signal, sys\n"
        f"sys.path.insert(0, {str(REPO / 'bench')!r})\n"
        "import probe_hardening as ph\n"
        "from casmoe.planner.eap import EAP\n"
        "EAP.save = lambda self, path: os.kill(os.getpid(), signal.SIGKILL)\n"
        f"ph.planner_folder(ph.Path({str(d)!r}), seed=1, prompts=7)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=d, capture_output=True, preexec_fn=_limits)
    after = {f.name: f.read_bytes() for f in (d / "p").iterdir() if not f.name.startswith(".")}
    served = run(["replay", "--trace", "t.npz", "--policy", "casmoe", "--planner", "p"], d)
    if served.returncode == 0 and after != before:
        return subprocess.CompletedProcess(served.args, 1, "", f"a mixed folder was served: {sorted(after)}")
    if served.returncode != 0:
        return served  # judged as a one-line refusal
    return subprocess.CompletedProcess(served.args, 0, "", "")


def mixed_planner(d: Path) -> None:
    """Planner A with B's index and patterns copied in (what a fit killed mid-save left behind
    before folders were written at once)."""
    small_trace(d)
    planner_folder(d)
    planner_folder(d, "b", seed=1, prompts=7)
    for name in ("eam.index", "eam_patterns.npy"):
        (d / "p" / name).write_bytes((d / "b" / name).read_bytes())


def bomb(d: Path) -> None:
    """A 3 MB trace whose arrays declare ~3 GiB (a member of zeros deflates ~1000:1)."""
    import zipfile

    small_trace(d)
    with zipfile.ZipFile(d / "t.npz", "a", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("pad.npy", "w", force_zip64=True) as fh:
            chunk = bytes(16 << 20)
            for _ in range(3 * 64):
                fh.write(chunk)


def bom(text: bytes) -> bytes:
    return b"\xef\xbb\xbf" + text


def grid(extra: str, with_bom: bool = False) -> Callable[[Path], None]:
    text = (f'traces = ["{TRACE}"]\nmodels = ["mixtral-8x7b"]\nhardware = ["rtx4090x4"]\npolicies = ["lru"]\n'
            f"requests = 2\n{extra}\n").encode()
    return write("g.toml", bom(text) if with_bom else text)


def whole_or_refused(p: subprocess.CompletedProcess, d: Path) -> str:
    """Exit 0: the old output was used whole; exit 2: refused in one line; else what went wrong."""
    return "" if p.returncode == 0 else (one_line_error(p, d) if p.returncode == 2 else p.stderr)


def accepted(p: subprocess.CompletedProcess, d: Path) -> str:
    """The input is legal: casmoe must do the work (exit 0)."""
    if p.returncode == 0:
        return ""
    err = p.stderr.strip().splitlines()
    return f"refused (exit {p.returncode}): {(err[-1] if err else '')[:90]}"


def names(*words: str) -> Callable[[subprocess.CompletedProcess, Path], str]:
    """A one-line error that mentions every word (the user's file, the fix)."""
    def check(p: subprocess.CompletedProcess, d: Path) -> str:
        bad = one_line_error(p, d)
        missing = [w for w in words if w not in p.stderr]
        return bad or (f"the error does not name {missing}: {p.stderr.strip().splitlines()[-1][:80]}" if missing else "")

    return check


def within(seconds: float, check: Callable) -> Callable[[subprocess.CompletedProcess, Path], str]:
    def inner(p: subprocess.CompletedProcess, d: Path) -> str:
        bad = check(p, d)
        took = getattr(p, "elapsed", 0.0)
        return bad or (f"took {took:.0f} s (more than {seconds:.0f})" if took > seconds else "")

    return inner


def only_line(p: subprocess.CompletedProcess, d: Path) -> str:
    """A one-line error and nothing else on stderr (no retry warnings before it)."""
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    return one_line_error(p, d) or (f"{len(lines)} lines on stderr" if len(lines) != 1 else "")


def before_fit(p: subprocess.CompletedProcess, d: Path) -> str:
    bad = one_line_error(p, d)
    return bad or ("failed only after the fit" if "train EAP" in p.stderr or "embed" in p.stderr else "")


def record_bom_prompt(p: subprocess.CompletedProcess, d: Path) -> str:
    if p.returncode != 0:
        return accepted(p, d)
    from casmoe.trace_io import load_trace

    prompt = load_trace(d / "r.npz").requests[0].prompt or ""
    return "the first prompt starts with a BOM" if prompt.startswith("\ufeff") else ""


def long_name_written(p: subprocess.CompletedProcess, d: Path) -> str:
    return accepted(p, d) or ("" if (d / LONG).exists() else "no output file")


LONG = "r" * 240 + ".npz"
UE = "unclear"
NA = "non-atomic"


def probes_files() -> list[Probe]:
    sim = ["simulate", *T, "--requests", "2", "--out", "o"]
    serve = ["replay", "--trace", "t.npz", "--policy", "casmoe", "--planner", "p"]
    pf = f"{TB} 15 planner folder"
    return [
        Probe(pf, "eam.index truncated", serve, setup=damaged_planner(truncate("eam.index"))),
        Probe(pf, "eam.index of another dimension", serve, setup=damaged_planner(index_of_dim)),
        Probe(pf, "eap.safetensors truncated", serve, setup=damaged_planner(truncate("eap.safetensors"))),
        Probe(pf, "eam_patterns.npy truncated", serve, setup=damaged_planner(truncate("eam_patterns.npy"))),
        Probe(pf, "fit.npz truncated", serve, setup=damaged_planner(truncate("fit.npz"))),
        Probe(pf, "epsilon \"0.8\"", serve, setup=damaged_planner(planner_json(lambda m: m["config"].update(epsilon="0.8")))),
        Probe(pf, "geometry disagrees with the weights", serve,
              setup=damaged_planner(planner_json(lambda m: m["geometry"].update(experts=9)))),
        Probe(pf, "fit entry of the wrong type", serve,
              setup=damaged_planner(planner_json(lambda m: m["fit"].update(requests="3")))),
        Probe(pf, "eap_linear.npz truncated, no manifest", serve,
              setup=damaged_planner(truncate("eap_linear.npz"), planner_folder_v2, manifest=False)),
        Probe(pf, "trajectory.npz truncated, no manifest", serve,
              setup=damaged_planner(truncate("trajectory.npz"), planner_folder_v2, manifest=False)),
        Probe(pf, "unknown stage in planner.json, no manifest", serve,
              setup=damaged_planner(planner_json(lambda m: m.update(stages=["eam", "oracle"])), planner_folder_v2,
                                    manifest=False)),
        Probe(f"{SW} 7 nothing measured", "simulate: every policy at a capacity below top_k", sim + ["--capacity", "0"],
              check=no_tmp_left(one_line_error)),
        Probe(f"{SW} 7 nothing measured", "sweep: every point below top_k", ["sweep", "g.toml", "--out", "sw"],
              setup=grid("capacities = [0, 1]")),
        Probe(f"{SW} 7 nothing measured", "trace synth --requests 0", ["trace", "synth", "o.npz", "--requests", "0"],
              check=refused),
        Probe(f"{UE} 9 usage errors", "simulate --batch 0 (click's range check)", sim + ["--batch", "0"]),
        Probe(f"{UE} 9 usage errors", "simulate --polcy lru (a misspelt flag)", sim + ["--polcy", "lru"]),
        Probe(f"{UE} 9 usage errors", "trace synth without its output", ["trace", "synth"]),
        Probe(f"{TB} 16 disk full", "planner fit to a full disk",
              ["planner", "fit", "--trace", "t.npz", "--out", "full/p", "--epochs", "1", "--holdout-every", "0"],
              setup=prompt_trace, check=no_partial_folder("full/p"), slow=True),
        Probe(f"{TB} 17 cpu mode", "cpu_tflops = 0 with --miss-mode cpu", sim + ["--hardware", "hw.toml", "--miss-mode", "cpu"],
              setup=hardware(cpu_tflops="0")),
        Probe(f"{TB} 18 prompt files", "non-UTF-8 prompts for record",
              ["record", "-m", "tiny-mixtral", "-p", "p.txt", "-o", "r.npz", "-n", "1", "--threads", "1"],
              setup=write("p.txt", "caf\u00e9 au lait\n".encode("latin-1"))),
        Probe(f"{TB} 18 prompt files", "BOM-prefixed prompts for record",
              ["record", "-m", "tiny-mixtral", "-p", "p.txt", "-o", "r.npz", "-n", "1", "--threads", "1",
               "--decode", "sample"],
              setup=write("p.txt", bom(b"the cat sat on the mat\n")), check=record_bom_prompt, slow=True),
        Probe(f"{TB} 19 splits", "meta splits shorter than the requests", ["trace", "show", "t.npz"],
              setup=lambda d: npz_meta(d, lambda m: m.update(splits=["train"]))),
        Probe(f"{TB} 20 lrc numbers", "lrc --rho nan", ["lrc", *T, "--rho", "nan", "--replicates", "5"]),
        Probe(f"{TB} 20 lrc numbers", "lrc --rho inf", ["lrc", *T, "--rho", "inf", "--replicates", "5"]),
        Probe(f"{TB} 21 synth like", "synth --like a trace without computed decode rows",
              ["trace", "synth", "o.npz", "--like", "g.npz", "--requests", "2"], setup=gap_trace),
        Probe(f"{TB} 22 nan options", "planner eval --epsilon nan",
              ["planner", "eval", "--planner", "p", "--trace", "t.npz", "--epsilon", "nan"],
              setup=lambda d: (prompt_trace(d), planner_folder(d))),
        Probe(f"{TB} 22 nan options", "trace synth --zipf nan", ["trace", "synth", "o.npz", "--zipf", "nan", "--requests", "2"]),
        Probe(f"{TB} 22 nan options", "grid rates = [nan]", ["sweep", "g.toml", "--out", "sw"], setup=grid("rates = [nan]\ncapacities = [4]")),
        Probe(f"{TB} 22 nan options", "sweep think = inf", ["sweep", "g.toml", "--out", "sw"],
              setup=grid("capacities = [4]\nusers = 1\nthink = inf")),
        Probe(f"{NA} 1 planner folder", "a killed save leaves the old planner whole", [], check=whole_or_refused,
              slow=True),
        Probe(f"{NA} 1 planner folder", "a mixed folder is not served", serve, setup=mixed_planner),
        Probe(f"{UE} 1 BOM", "BOM in a profile TOML", sim + ["--hardware", "hw.toml", "--policy", "lru"],
              setup=lambda d: (hardware()(d), (d / "hw.toml").write_bytes(bom((d / "hw.toml").read_bytes()))),
              check=accepted),
        Probe(f"{UE} 1 BOM", "BOM in a grid TOML", ["sweep", "g.toml", "--out", "sw"], setup=grid("capacities = [4]", True),
              check=accepted),
        Probe(f"{UE} 2 copied profile", "error names the user's file", sim + ["--hardware", "my-box.toml"],
              setup=lambda d: (hardware(memory_gib="0")(d), (d / "hw.toml").rename(d / "my-box.toml")),
              check=names("my-box.toml")),
        Probe(f"{UE} 3 long names", "a legal 244-byte output name", ["trace", "synth", LONG, "--requests", "2"],
              check=long_name_written),
        Probe(f"{UE} 4 lrc #", "lrc -t 'run#1.npz'", ["lrc", "-t", "run#1.npz", "--replicates", "5", "--m", "4"],
              setup=lambda d: small_trace(d, "run#1.npz"), check=accepted),
        Probe(f"{UE} 5 fit --out", "planner fit --out a read-only folder fails before the fit",
              ["planner", "fit", "--trace", "t.npz", "--out", "ro/p", "--epochs", "1", "--holdout-every", "0"],
              setup=prompt_trace, check=before_fit, slow=True),
        Probe(f"{UE} 6 grid types", "capacities = [4.5]", ["sweep", "g.toml", "--out", "sw"], setup=grid("capacities = [4.5]"),
              check=names("g.toml", "slots")),
        Probe(f"{UE} 7 unknown model", "unknown model name offline",
              ["record", "-m", "no-such-org/no-such-model", "-p", "p.txt", "-o", "r.npz", "--threads", "1"],
              setup=write("p.txt", "hello\n"), env={"HF_HUB_OFFLINE": "0", "HF_HUB_ETAG_TIMEOUT": "2"},
              check=within(20, only_line)),
        Probe(f"{UE} 8 npz bomb", "3 MB .npz declaring 3 GiB", ["trace", "info", "t.npz"], setup=bomb,
              check=within(10, names("t.npz"))),
    ]


# ---- the user study and independent probe set: importers, foreign files, caches, extras ----------

def _moe_rows(tokens: int, layers: int = 3, k: int = 2, experts: int = 6, dense: bool = True, seed: int = 0) -> list:
    """Routed ids [tokens, layers, k] as an engine writes them: layer 0 dense (zeros) if `dense`."""
    rng = np.random.default_rng(seed)
    rows = np.argsort(rng.random((tokens, layers, experts)), axis=2)[:, :, :k]
    if dense:
        rows[:, 0] = 0
    return rows.tolist()


def vllm_whole(extra: int) -> Callable[[Path], None]:
    """Older vLLM's whole-sequence array for 5 prompt + 3 generated tokens: 7 rows, plus `extra`."""
    doc = {"prompt_token_ids": [1, 2, 3, 4, 5],
           "outputs": [{"token_ids": [7, 8, 9], "routed_experts": _moe_rows(7 + extra)}]}
    return write("r.json", json.dumps(doc))


def vllm_response(rid: str | None = "cmpl-1", seed: int = 0) -> str:
    doc = {"prompt_token_ids": [1, 2, 3], "prompt_routed_experts": _moe_rows(3, seed=seed), "created": 1700000000,
           "choices": [{"token_ids": [4, 5, 6], "routed_experts": _moe_rows(2, seed=seed + 1)}]}
    if rid is not None:
        doc["id"] = rid
    return json.dumps(doc)


def sglang_dump(d: Path, passes: list, name: str = "d.pt", bad: int | None = None) -> None:
    """An SGLang per_token dump of `passes` [(mode, [(first position, tokens)])]: 3 layers (0
    dense), top-2, an identity map over 6 experts; `bad` replaces one routed id."""
    import torch

    rng = np.random.default_rng(1)
    records = []
    for fid, (mode, segments) in enumerate(passes):
        n = sum(t for _, t in segments)
        topk = np.full((3, n, 8), -1, dtype=np.int32)
        topk[1:, :, :2] = np.argsort(rng.random((2, n, 6)), axis=2)[:, :, :2]
        if bad is not None and fid == 0:
            topk[1, 0, 0] = bad
        records.append({
            "forward_pass_id": fid, "rank": 0, "input_ids": [int(i) for i in rng.integers(0, 99, n)],
            "positions": [p for start, t in segments for p in range(start, start + t)],
            "extend_seq_lens": [t for _, t in segments] if mode == 1 else None, "forward_mode": mode,
            "topk_ids_of_layer": torch.tensor(topk)})
    torch.save({"records": records, "last_physical_to_logical_map": torch.tensor(np.tile(np.arange(6), (3, 1)))},
               d / name)


SERIAL = [(1, [(0, 3)]), (2, [(3, 1)]), (2, [(4, 1)]), (2, [(5, 1)]),  # A: 3 prompt tokens, 3 decoded
          (1, [(0, 5)]), (2, [(5, 1)]), (2, [(6, 1)]), (2, [(7, 1)])]  # then B: 5 prompt tokens, 3 decoded


def sglang_response(experts_seen: int) -> str:
    """An SGLang response routed over mixtral-8x7b's 32 layers, top-2, ids below `experts_seen`."""
    import base64

    rng = np.random.default_rng(2)
    ids = np.stack([np.stack([rng.choice(experts_seen, 2, replace=False) for _ in range(32)]) for _ in range(5)])
    return json.dumps({"text": "t", "output_ids": [1, 2, 3], "meta_info": {
        "id": "r0", "prompt_tokens": 3, "completion_tokens": 3,
        "routed_experts": base64.b64encode(ids.astype("<i4").tobytes()).decode()}})


def torch_file(name: str, make: Callable[[], object]) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        import torch

        torch.save(make(), d / name)

    return setup


def foreign(name: str, kind: str) -> Callable[[Path], None]:
    def setup(d: Path) -> None:
        import zipfile

        p = d / name
        if kind == "zip":
            with zipfile.ZipFile(p, "w") as zf:
                zf.writestr("notes.txt", "hello")
        elif kind == "npy-pickle":
            with open(p, "wb") as fh:
                np.save(fh, np.array([{"a": 1}], dtype=object), allow_pickle=True)
        elif kind == "folder":
            p.mkdir()
        elif kind == "empty":
            p.write_bytes(b"")
        elif kind == "binary":
            p.write_bytes(bytes(range(256)) * 8)

    return setup


def npy_declaring(rows: int) -> Callable[[Path], None]:
    header = f"{{'descr': '<i8', 'fortran_order': False, 'shape': ({rows}, 2, 2), }}"
    header += " " * (118 - len(header)) + "\n"
    return write("big.npy", b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(64))


def extreme_logits(d: Path) -> None:
    logits = np.zeros((1, 3, 4))
    logits[0, 0, :2] = (1e308, -1e308)  # the softmax's subtraction overflows
    np.save(d / "l0.npy", logits)
    np.save(d / "l1.npy", logits)


def trace_is(check: Callable[[object], str]) -> Callable[[subprocess.CompletedProcess, Path], str]:
    """Accepted, and the trace written to o.npz passes `check` ("" or what is wrong)."""
    def inner(p: subprocess.CompletedProcess, d: Path) -> str:
        bad = accepted(p, d)
        if bad:
            return bad
        from casmoe.trace_io import load_trace

        return check(load_trace(d / "o.npz"))

    return inner


def serial_requests(tr) -> str:
    got = [(r.prefill, r.decode_tokens) for r in tr.requests]
    return "" if got == [(3, 3), (5, 3)] else f"requests (prefill, decode) {got}, expected [(3, 3), (5, 3)]"


def silent_accept(p: subprocess.CompletedProcess, d: Path) -> str:
    """Accepted with nothing on stderr (no library warning lines)."""
    return accepted(p, d) or (f"stderr: {p.stderr.strip().splitlines()[0][:80]}" if p.stderr.strip() else "")


def run_python(code: str, d: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=d, capture_output=True, text=True, preexec_fn=_limits,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)


def extras_probe(d: Path) -> str:
    """`from casmoe.sim.testing import check_policy` without hypothesis: the last line names the extra."""
    p = run_python("import sys; sys.modules['hypothesis'] = None\nfrom casmoe.sim.testing import check_policy\n", d)
    last = (p.stderr.strip().splitlines() or [""])[-1]
    return "" if "pip install 'casmoe[test]'" in last and "halted" not in p.stderr else f"last line: {last[:90]}"


def damaged_cache_probe(d: Path) -> str:
    """Fit casmoe[planner=auto] into a cache, cut its index, run again: the run goes on, refitted,
    with one note line and no error."""
    prompt_trace(d)
    args = ["replay", "--trace", "t.npz", "--policy", "casmoe[planner=auto]", "--capacity", "4"]
    env = {"CASMOE_CACHE": str(d / "cache")}
    first = run(args, d, env=env)
    if first.returncode != 0:
        return f"setup: the first fit failed: {first.stderr.strip().splitlines()[-1][:80]}"
    [entry] = (d / "cache").glob("planner-*")
    truncate("eam.index")(entry)
    again = run(args, d, env=env)
    notes = [ln for ln in again.stderr.splitlines() if ln.startswith("casmoe: note:")]
    return accepted(again, d) or ("" if len(notes) == 1 else f"{len(notes)} note lines: {again.stderr[-120:]}")


ST = "study"


def probes_study() -> list[Probe]:
    imp = ["trace", "import"]
    c2, c3, c4, c5 = f"{SW} 8 importer counting", f"{UE} 10 foreign files", f"{UE} 11 caches", f"{TB} 23 extras"
    return [
        # class 2: importers that count or place wrongly without a word
        Probe(c2, "vLLM whole sequence one row longer", imp + ["r.json", "-o", "o.npz"], setup=vllm_whole(1),
              check=names("r.json", "8 rows", "make 7")),
        Probe(c2, "vLLM whole sequence one row shorter", imp + ["r.json", "-o", "o.npz"], setup=vllm_whole(-1),
              check=names("r.json", "6 rows", "make 7")),
        Probe(c2, "vLLM whole sequence that adds up", imp + ["r.json", "-o", "o.npz"], setup=vllm_whole(0),
              check=trace_is(lambda tr: "" if tr.requests[0].prefill == 5 else f"prefill {tr.requests[0].prefill}")),
        Probe(c2, "the same response twice in a JSONL", imp + ["r.jsonl", "-o", "o.npz"],
              setup=write("r.jsonl", (vllm_response() + "\n") * 2), check=names("twice")),
        Probe(c2, "the same file given twice", imp + ["r.json", "r.json", "-o", "o.npz"],
              setup=write("r.json", vllm_response()), check=names("twice")),
        Probe(c2, "a file and its copy", imp + ["r.json", "copy.json", "-o", "o.npz"],
              setup=chain(write("r.json", vllm_response()), write("copy.json", vllm_response())), check=names("twice")),
        Probe(c2, "negative physical expert id in an SGLang dump", imp + ["d.pt", "-o", "o.npz"],
              setup=lambda d: sglang_dump(d, SERIAL[:2], bad=-5), check=names("d.pt", "record 0", "layer 1", "-5")),
        Probe(c2, "SGLang requests of different lengths one after another", imp + ["d.pt", "-o", "o.npz"],
              setup=lambda d: sglang_dump(d, SERIAL), check=trace_is(serial_requests)),
        Probe(c2, "a boolean mask as popularity counts", ["popularity", "import", "--format", "ktransformers", "m.pt", "-o",
                                                          "p.npz"],
              setup=torch_file("m.pt", lambda: __import__("torch").rand(4, 8) > 0.5), check=names("m.pt", "boolean")),
        Probe(c2, "an expert nobody routed to and a correct --model", imp + ["r.json", "--model", "mixtral-8x7b", "-o",
                                                                           "o.npz"],
              setup=write("r.json", sglang_response(6)),
              check=trace_is(lambda tr: "" if tr.geometry.experts == 8 else f"{tr.geometry.experts} experts")),
        # class 3: messages that name the file, row and cause
        Probe(c3, "a zip named .csv", imp + ["x.csv", "-o", "o.npz"], setup=foreign("x.csv", "zip"),
              check=names("x.csv is a zip archive, not a routing CSV")),
        Probe(c3, "a pickled .npy", imp + ["x.npy", "--num-experts", "4", "-o", "o.npz"],
              setup=foreign("x.npy", "npy-pickle"), check=names("x.npy is a NumPy .npy file of pickled")),
        Probe(c3, "a .pt that is not a profile", ["popularity", "info", "m.pt"],
              setup=torch_file("m.pt", lambda: {"weight": __import__("torch").zeros(3)}),
              check=names("m.pt is a torch.save file, not a casmoe profile")),
        Probe(c3, "a .pt as static[profile=]", ["replay", *T, "--policy", "static[profile=m.pt]", "--capacity", "4"],
              setup=torch_file("m.pt", lambda: {"weight": __import__("torch").zeros(3)}),
              check=names("m.pt is a torch.save file")),
        Probe(c3, "an empty file", imp + ["e.csv", "-o", "o.npz"], setup=foreign("e.csv", "empty"),
              check=names("e.csv is an empty file")),
        Probe(c3, "a folder given as a CSV", imp + ["--format", "csv", "d.csv", "-o", "o.npz"],
              setup=foreign("d.csv", "folder"), check=names("d.csv is a folder")),
        Probe(c3, "binary garbage named .csv", imp + ["g.csv", "-o", "o.npz"], setup=foreign("g.csv", "binary"),
              check=names("g.csv is binary data")),
        Probe(c3, "a non-numeric CSV cell", imp + ["x.csv", "-o", "o.npz"],
              setup=write("x.csv", csv_text(rows="0,1,0,0,0,1,0.5\n0,1,0,0,1,x,0.5\n")), check=names("x.csv", "data row 2")),
        Probe(c3, "an .npy declaring 10^12 rows", imp + ["big.npy", "--num-experts", "4", "-o", "o.npz"],
              setup=npy_declaring(10**12), check=within(10, names("big.npy", "out of memory"))),
        Probe(c3, "numpy's warnings on extreme logits", imp + ["l0.npy", "l1.npy", "--top-k", "2", "-o", "o.npz"],
              setup=extreme_logits, check=silent_accept),
        # class 4: caches
        Probe(c4, "CASMOE_CACHE names a file", ["replay", "--trace", "t.npz", "--policy", "casmoe[planner=auto]"],
              setup=chain(prompt_trace, write("f", "mine")), env={"CASMOE_CACHE": "f"},
              check=names("f is a file, not a folder", "CASMOE_CACHE")),
        Probe(c4, "a damaged planner=auto cache entry is fitted again", [], slow=True),
        # class 5: extras
        Probe(c5, "check_policy without the test extra", []),
    ]


def gap_trace(d: Path) -> None:
    from casmoe.trace import NOT_COMPUTED
    from casmoe.trace_io import load_trace, save_trace

    small_trace(d)
    tr = load_trace(d / "t.npz")
    for r in tr.requests:
        r.topk[r.prefill :] = NOT_COMPUTED
        r.weights[r.prefill :] = 0
    save_trace(tr, d / "g.npz")


# ---- box: a user's question on one RTX 4090 (prices, noise, unchecked values) ------------------------

BOX = "box"
UC, NO, PR, AD = "unchecked", "noise", "price", "advice"
QWEN = REPO / "traces" / "synthetic-qwen3.npz"


def box_4090(d: Path) -> None:
    """The study's box: rtx4090x4.toml copied, one GPU, 64 GB of RAM, PCIe 4 (as shipped)."""
    hardware(name='"my4090"', gpus="1", host_ram_gib="64.0")(d)
    (d / "hw.toml").rename(d / "my4090.toml")


def no_loop(base: list[str], steps: dict[str, list[str]]) -> Callable[[Path], str]:
    """Run `base`: refused in one line; every step its message suggests (a phrase -> the flags
    that take it) must run, not be refused in turn; at least one must be suggested."""
    def runner(d: Path) -> str:
        first = run(base, d)
        bad = one_line_error(first, d)
        if bad:
            return f"the first run: {bad}"
        said = [phrase for phrase in steps if phrase in first.stderr]
        if not said:
            return f"names no step of {list(steps)}: {first.stderr.strip()[-110:]}"
        for phrase in said:
            again = run(base + steps[phrase], d)
            if again.returncode != 0:
                last = (again.stderr.strip().splitlines() or [""])[-1]
                return f"its advice '{phrase}' is refused in turn: {last[:100]}"
        return ""

    return runner


def without_noise(p: subprocess.CompletedProcess, d: Path) -> str:
    """Accepted; stderr empty; no line the user did not ask for on stdout."""
    bad = accepted(p, d)
    if bad:
        return bad
    if p.stderr.strip():
        return f"stderr: {p.stderr.strip().splitlines()[0][:90]}"
    noisy = [ln for ln in p.stdout.splitlines() if "experts per layer fit in GPU memory" in ln]
    return f"stdout: {noisy[0][-80:]}" if noisy else ""


def lines_with(word: str, most: int) -> Callable[[subprocess.CompletedProcess, Path], str]:
    def check(p: subprocess.CompletedProcess, d: Path) -> str:
        bad = accepted(p, d)
        n = sum(word in ln for ln in (p.stdout + p.stderr).splitlines())
        return bad or (f"{n} lines with {word!r} (at most {most})" if n > most else "")

    return check


def warning_line(p: subprocess.CompletedProcess, d: Path) -> str:
    """A multi-line library warning reaches the user as one `casmoe: warning:` line."""
    bad = accepted(p, d)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    return bad or ("" if lines == ["casmoe: warning: first line second line"] else f"stderr: {lines[:3]}")


def api(call: str, runs: bool) -> Callable[[Path], str]:
    """`casmoe.sim.simulate(...)` from Python: it runs, or raises a CasmoeError of one line."""
    code = ("import numpy as np, pathlib, sys\nimport casmoe.sim\nfrom casmoe.errors import CasmoeError\n"
            f"try:\n    r = casmoe.sim.simulate(trace={str(TRACE)!r}, requests=2, {call})\n"
            "    print('ran', len(r.records))\n"
            "except CasmoeError as e:\n    print('refused:', e)\n")

    def runner(d: Path) -> str:
        p = run_python(code, d)
        out = p.stdout.strip()
        if p.returncode != 0:
            return f"exit {p.returncode}: {(p.stderr.strip().splitlines() or [''])[-1][:90]}"
        if runs:
            return "" if out.startswith("ran") else out[:110]
        return "" if out.startswith("refused:") and len(out.splitlines()) == 1 else f"accepted: {out[:90]}"

    return runner


def held_lock(args: list[str]) -> Callable[[Path], str]:
    """Another casmoe run holds `o`'s lock: a second writer into it is refused in one line."""
    def runner(d: Path) -> str:
        import fcntl

        (d / "o" / "points").mkdir(parents=True)
        with open(d / "o" / "points" / ".lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fh.write("pid 1")
            fh.flush()
            return names("another casmoe run", "--out")(run(args, d), d)

    return runner


def search_json(check: Callable[[dict], str]) -> Callable[[subprocess.CompletedProcess, Path], str]:
    def inner(p: subprocess.CompletedProcess, d: Path) -> str:
        bad = accepted(p, d)
        return bad or check(json.loads((d / "s" / "search.json").read_text()))

    return inner


def cheaper_link_wins(summary: dict) -> str:
    links = [row["config"].split("link=")[1].split(",")[0] for row in summary["pareto"]]
    return "" if links == ["pcie4"] else f"Pareto links {links}, expected the cheaper ['pcie4'] alone"


def unknown_price(summary: dict) -> str:
    rows = summary["pareto"] + summary["answers"]
    return "" if rows and all(r.get("price_usd", 0) is None and r.get("price", "").startswith("unknown") for r in rows) else \
        f"prices {[r.get('price') for r in rows][:2]}"


def quant_advice_runs(d: Path) -> str:
    """search on a box that holds fewer experts than top_k: the answer names an option that
    holds them, and searching with it answers."""
    base = ["search", *T, "--model", "mixtral-8x7b", "--hardware", "my4090.toml", "--policy", "lru", "--requests", "2",
            "--target", "tok/s>=0.1", "--out", "s"]
    first = run(base, d)
    if first.returncode != 0:
        return f"refused: {(first.stderr.strip().splitlines() or [''])[-1][:90]}"
    if "--quant int8 holds" not in first.stdout:
        return f"names no option that holds top_k: {first.stdout.strip()[-100:]}"
    again = run(base + ["--quant", "int8"], d)
    return accepted(again, d) or ("" if "cheapest configurations" in again.stdout else "still no answer with --quant int8")


def probes_box() -> list[Probe]:
    sim = ["simulate", *T, "--requests", "2", "--out", "o", "--plots", "none"]
    lru = sim + ["--policy", "lru", "--capacity", "2"]
    srch = ["search", *T, "--requests", "2", "--policy", "lru", "--out", "s"]
    mine = ["simulate", *T, "--model", "mixtral-8x7b", "--hardware", "my4090.toml", "--requests", "2", "--policy", "lru",
            "--out", "o", "--plots", "none"]
    tg, po, hw, hc, py, sw, bx, wr = (f"{UC} {BOX} {c}" for c in ("target", "policy options", "hardware variant",
                                                                   "host cache", "python api", "sweep types",
                                                                   "box flags", "one writer"))
    sweep = ["sweep", "g.toml", "--out", "sw", "--jobs", "1", "--plots", "none"]
    return [
        # search --target: a metric that does not exist, is no number, or goes the wrong way
        Probe(tg, "--target speed>=3", srch + ["--target", "speed>=3"], check=names("tok/s")),
        Probe(tg, "--target policy>=3 (a text field)", srch + ["--target", "policy>=3"], check=names("not a measured")),
        Probe(tg, "--target late_by_layer<=1 (a list)", srch + ["--target", "late_by_layer<=1"], check=names("list")),
        Probe(tg, "--target devices>=2 (an input)", srch + ["--target", "devices>=2"], check=names("given")),
        Probe(tg, "--target misses>=100 (wrong way)", srch + ["--target", "misses>=100"], check=names("misses<=100")),
        Probe(tg, "--target misses<=1e9 is a legal target", srch + ["--target", "misses<=1e9"], check=accepted),
        Probe(tg, "--target stall_s<=1e3 (a record total)", srch + ["--target", "stall_s<=1e3"], check=accepted),
        Probe(tg, "--target tok/s>=fast", srch + ["--target", "tok/s>=fast"], check=names("give a number")),
        Probe(tg, "--target tok/s>=1e999", srch + ["--target", "tok/s>=1e999"], check=names("finite")),
        Probe(tg, "--target hit_rate>=50%", srch + ["--target", "hit_rate>=50%"], check=accepted),
        Probe(tg, "--target hit_rate>=1.5 (a share)", srch + ["--target", "hit_rate>=1.5"], check=names("0.5")),
        Probe(tg, "--target ttft_p99<=-1 (never met)", srch + ["--target", "ttft_p99<=-1"], check=names(">= 0")),
        Probe(tg, "--target queue_wait_p99_s<=1 without arrivals", srch + ["--target", "queue_wait_p99_s<=1"],
              check=names("--rate")),
        Probe(tg, "two --target flags", srch + ["--target", "tok/s>=3", "--target", "ttft_p99<=2"],
              check=names("one --target")),
        # policy options that collide with constructor arguments, or drop one another
        Probe(po, "n-cpu-moe[gpu=3] names what it takes", sim + ["--policy", "n-cpu-moe[gpu=3]", "--capacity", "2"],
              check=names("n=")),
        Probe(po, "n-cpu-moe[gpu=3] beside lru is refused, not skipped", lru + ["--policy", "n-cpu-moe[gpu=3]"],
              check=refused),
        Probe(po, "lru[capacity=3]", lru + ["--policy", "lru[capacity=3]"], check=refused),
        Probe(po, "speculative[experts=1,experts=2]", lru + ["--policy", "speculative[experts=1,experts=2]"],
              check=names("twice")),
        Probe(po, "casmoe[planner=auto,planner=p]", lru + ["--policy", "casmoe[planner=auto,planner=p]"],
              check=names("twice")),
        Probe(po, "casmoe[predictor=noisy,planner=auto]", sim + ["--policy", "casmoe[predictor=noisy,planner=auto]",
                                                                 "--capacity", "2"], check=names("not both")),
        Probe(po, "casmoe[predictor=noisy,planner=auto] beside lru is refused, not skipped",
              lru + ["--policy", "casmoe[predictor=noisy,planner=auto]"], check=refused),
        Probe(po, "static[profile=] (empty value)", lru + ["--policy", "static[profile=]"], check=names("profile=")),
        Probe(po, "--planner with no casmoe policy", lru + ["--planner", "p"], check=names("--planner")),
        Probe(po, "casmoe[planner=auto] with --planner DIR", lru + ["--policy", "casmoe[planner=auto]", "--planner", "p"],
              check=names("--planner")),
        Probe(po, "--host-policy with no RAM tier", lru + ["--host-cache", "none", "--host-policy", "lfu"],
              check=names("--host-policy")),
        # hardware variant strings: empty or contradicting values
        Probe(hw, "NAME@ (empty)", lru + ["--hardware", "rtx4090x4@"], check=names("rtx4090x4@gpus=")),
        Probe(hw, "NAME@gpus= (empty value)", lru + ["--hardware", "rtx4090x4@gpus="], check=refused),
        Probe(hw, "NAME@gpus=2,gpus=4", lru + ["--hardware", "rtx4090x4@gpus=2,gpus=4"], check=names("twice")),
        Probe(hw, "NAME@gpus=2@gpus=4", lru + ["--hardware", "rtx4090x4@gpus=2@gpus=4"], check=refused),
        Probe(hw, "@gpus=2 with --gpus 4", lru + ["--hardware", "rtx4090x4@gpus=2", "--gpus", "4"], check=refused),
        Probe(hw, "@link=pcie3 with --link pcie5", lru + ["--hardware", "rtx4090x4@link=pcie3", "--link", "pcie5"],
              check=refused),
        Probe(hw, "@host_ram_gib=64 with --host-ram 128",
              lru + ["--hardware", "rtx4090x4@host_ram_gib=64", "--host-ram", "128"], check=refused),
        Probe(hw, "@gpus=2 (no profile name)", lru + ["--hardware", "@gpus=2"], check=names("rtx4090x4")),
        Probe(hw, "--hardware '' names the profiles", lru + ["--hardware", ""], check=names("rtx4090x4")),
        Probe(hw, "@host_ram_gib=1e-300 is about RAM", lru + ["--hardware", "rtx4090x4@host_ram_gib=1e-300"],
              check=names("RAM")),
        Probe(hw, "@gpus=2_0 is not 20 GPUs", lru + ["--hardware", "rtx4090x4@gpus=2_0"], check=refused),
        Probe(hw, "@link=pcie9", lru + ["--hardware", "rtx4090x4@link=pcie9"], check=names("pcie5")),
        Probe(hw, "@host_ram_gib=nan", lru + ["--hardware", "rtx4090x4@host_ram_gib=nan"], check=names("finite")),
        Probe(hw, "--link '' (empty)", lru + ["--link", ""], check=names("pcie4")),
        # --host-cache values that exit 0, or fail naming something else
        Probe(hc, "--host-cache none on a box whose RAM holds fewer experts",
              ["simulate", *T, "--model", "mixtral-8x7b", "--hardware", "my4090.toml@gpus=4", "--requests", "2",
               "--policy", "lru", "--capacity", "2", "--host-cache", "none", "--out", "o", "--plots", "none"],
              setup=box_4090, check=names("--allow-overcommit")),
        Probe(hc, "--host-cache -5GB names --host-cache", lru + ["--host-cache", "-5GB"], check=names("--host-cache")),
        Probe(hc, "--host-cache experts (the help's word)", lru + ["--host-cache", "experts"], check=names("--host-cache")),
        Probe(hc, "--host-cache 0", lru + ["--host-cache", "0"], check=refused),
        Probe(hc, "--host-cache 3.5", lru + ["--host-cache", "3.5"], check=refused),
        Probe(hc, "--host-cache 1000TB names what fits", lru + ["--host-cache", "1000TB"], check=names("256")),
        # the Python API
        Probe(py, "simulate(capacities=4.5)", runner=api("policies=['lru'], capacities=4.5", runs=False)),
        Probe(py, "simulate(capacities=np.int64(4))", runner=api("policies=['lru'], capacities=np.int64(4)", runs=True)),
        Probe(py, "simulate(capacities=np.array([2, 4]), batch=np.int32(1))",
              runner=api("policies=['lru'], capacities=np.array([2, 4]), batch=np.int32(1)", runs=True)),
        Probe(py, "simulate(capacities=True)", runner=api("policies=['lru'], capacities=True", runs=False)),
        Probe(py, "simulate(rate=np.float64('nan'))", runner=api("policies=['lru'], capacities=[2], rate=np.nan", runs=False)),
        Probe(py, "simulate(hardware=pathlib.Path(...))", setup=box_4090,
              runner=api("policies=['lru'], capacities=[2], quant='int4', hardware=pathlib.Path('my4090.toml')", runs=True)),
        Probe(py, "simulate(capacities=[])", runner=api("policies=['lru'], capacities=[]", runs=False)),
        Probe(py, "simulate(link='')", runner=api("policies=['lru'], capacities=[2], link=''", runs=False)),
        # sweep files: values of the wrong type, empty lists
        Probe(sw, "batch = \"2\"", sweep, setup=grid('batch = "2"\ncapacities = [4]'), check=names("g.toml")),
        Probe(sw, "capacities = [[4]]", sweep, setup=grid("capacities = [[4]]"), check=names("g.toml")),
        Probe(sw, "hardware = 5", sweep, setup=write("g.toml", f'traces = ["{TRACE}"]\nmodels = ["mixtral-8x7b"]\nhardware = 5\npolicies = ["lru"]\n'
                              "requests = 2\ncapacities = [4]\n"), check=names("g.toml")),
        Probe(sw, "pinned = \"yes\"", sweep, setup=grid('pinned = "yes"\ncapacities = [4]'), check=names("g.toml")),
        Probe(sw, "host_cache = [4.5]", sweep, setup=grid("host_cache = [4.5]\ncapacities = [4]"), check=names("g.toml")),
        Probe(sw, "link = \"\"", sweep, setup=grid('link = ""\ncapacities = [4]'), check=names("g.toml")),
        Probe(sw, "capacities = [] (no size)", sweep, setup=grid("capacities = []"), check=names("g.toml")),
        # --gpus 0, --link pcie9, --host-ram nan, and the rest of the box's flags
        Probe(bx, "simulate --gpus 0", lru + ["--gpus", "0"], check=refused),
        Probe(bx, "simulate --link pcie9", lru + ["--link", "pcie9"], check=names("pcie3")),
        Probe(bx, "simulate --host-ram nan", lru + ["--host-ram", "nan"], check=names("finite")),
        Probe(bx, "simulate --host-ram 0", lru + ["--host-ram", "0"], check=refused),
        Probe(bx, "search --gpus 0", srch + ["--target", "tok/s>=3", "--gpus", "0"], check=refused),
        Probe(bx, "search --link pcie9", srch + ["--target", "tok/s>=3", "--link", "pcie9"], check=names("pcie3")),
        Probe(bx, "search --host-ram nan", srch + ["--target", "tok/s>=3", "--host-ram", "nan"], check=names("finite")),
        Probe(bx, "search --budget 0", srch + ["--target", "tok/s>=3", "--budget", "0"], check=names("--budget")),
        Probe(bx, "search --prices without sources", srch + ["--target", "tok/s>=3", "--prices", "p.toml"],
              setup=write("p.toml", '[gpu."NVIDIA GeForce RTX 4090"]\nusd = 1000\n'), check=names("p.toml", "source")),
        Probe(bx, "search --gpus 1 --gpus 2 --devices 2", ["search", *T, "--model", "mixtral-8x7b", "--requests", "2",
                                                            "--policy", "lru", "--out", "s", "--target", "tok/s>=0.1",
                                                            "--hardware", "my4090.toml", "--quant", "int4", "--gpus", "1",
                                                            "--gpus", "2", "--devices", "2"],
              setup=box_4090, check=accepted),
        # two runs into one folder at once
        Probe(wr, "sweep into a folder another run writes", runner=held_lock(
            ["sweep", "--trace", str(TRACE), "--requests", "2", "--policy", "lru", "--capacity", "2", "--out", "o"])),
        Probe(wr, "search into a folder another run writes", runner=held_lock(srch[:-1] + ["o", "--target", "tok/s>=3"])),
        Probe(wr, "leaderboard into a folder another run writes", runner=held_lock(
            ["leaderboard", *T, "--requests", "1", "--no-fit-planner", "--out", "o"])),
        Probe(wr, "simulate into a folder another run writes", runner=held_lock(lru)),
        # every refusal names a step that works
        Probe(f"{AD} {BOX} loops", "no default cache fits: the advice runs", setup=box_4090, runner=no_loop(
            mine, {"more --devices": ["--devices", "2"], "--capacity for a what-if": ["--capacity", "2"],
                   "smaller --quant": ["--quant", "int8"]})),
        Probe(f"{AD} {BOX} loops", "--capacity 2 over what the box holds: the advice runs", setup=box_4090, runner=no_loop(
            mine + ["--capacity", "2"], {"smaller --capacity": ["--capacity", "1"], "more --devices": ["--devices", "2"],
                                         "--allow-overcommit": ["--allow-overcommit"]})),
        Probe(f"{AD} {BOX} loops", "--devices 2 on a 1-GPU box names --gpus", mine + ["--quant", "int4", "--devices", "2"],
              setup=box_4090, check=names("--gpus 2")),
        Probe(f"{AD} {BOX} loops", "--users with --rate names --rate", lru + ["--users", "2", "--rate", "0.5"],
              check=names("--rate")),
        Probe(f"{AD} {BOX} loops", "search on a box below top_k names an option that holds it", setup=box_4090,
              runner=quant_advice_runs),
        # no noise on a normal run
        Probe(f"{NO} {BOX} normal run", "simulate prints only what was asked", lru + ["--policy", "lfu"],
              check=without_noise),
        Probe(f"{NO} {BOX} normal run", "speculative without spec: one skipped line",
              ["simulate", "--trace", str(QWEN), "--requests", "1", "--policy", "speculative", "--policy", "lru",
               "--capacity", "6", "--capacity", "9", "--capacity", "12", "--out", "o", "--plots", "none"],
              check=lines_with("skipped", 1)),
        Probe(f"{NO} {BOX} normal run", "a library's multi-line warning is one line", sim + ["--policy", "userpol:P",
                                                                                             "--capacity", "2"],
              setup=user_policy("    def prefetch_layer(self, step, layer):\n        import warnings\n"
                                "        warnings.warn('first line\\nsecond line', RuntimeWarning)\n        return []\n"),
              check=warning_line),
        Probe(f"{NO} {BOX} normal run", "leaderboard on a box that skips a workload: one n/a line per reason",
              ["leaderboard", *T, "--hardware", "my4090.toml", "--requests", "1", "--no-fit-planner", "--out", "o"],
              setup=box_4090, check=lines_with("n/a", 1)),
        # the box's price
        Probe(f"{PR} {BOX} tie", "a placement that ignores the link: the cheaper link wins",
              ["search", *T, "--requests", "2", "--policy", "n-cpu-moe", "--gpus", "4", "--link", "pcie4", "--link",
               "pcie5", "--target", "tok/s>=1", "--out", "s"], check=search_json(cheaper_link_wins)),
        Probe(f"{PR} {BOX} tie", "a GPU with no price is searched, its price unknown",
              ["search", *T, "--requests", "2", "--policy", "lru", "--hardware", "hw.toml", "--target", "tok/s>=1",
               "--out", "s"], setup=hardware(gpu='"Unpriced GPU"'), check=search_json(unknown_price)),
    ]


def run_probe(pr: Probe, d: Path) -> str:
    if pr.setup:
        pr.setup(d)
    if pr.runner is not None:
        return pr.runner(d)
    if pr.name == "SIGKILLed trace export":
        return pr.check(kill_export(d), d)
    if pr.name == "SIGKILLed sweep leaves workers":
        return pr.check(kill_sweep(d), d)
    if pr.name == "resume with another --max-prompt-tokens":
        return probe_record(d)
    if pr.name == "a killed save leaves the old planner whole":
        return pr.check(killed_planner_save(d), d) if pr.check else ""
    if pr.name == "a damaged planner=auto cache entry is fitted again":
        return damaged_cache_probe(d)
    if pr.name == "check_policy without the test extra":
        return extras_probe(d)
    p = run(pr.args, d, env=pr.env)
    return (pr.check or no_tmp_left(one_line_error))(p, d)


def probe_record(d: Path) -> str:
    """SIGKILL a recording once it has checkpointed, then resume it with another
    --max-prompt-tokens: the partial file must be refused, not silently continued."""
    (d / "p.txt").write_text("\n".join(f"the cat sat on mat number {i} and then some more words" for i in range(40)))
    base = ["record", "-m", "tiny-mixtral", "-p", "p.txt", "-n", "8", "-o", "r.npz", "--batch", "1",
            "--checkpoint-every", "1", "--threads", "1", "--decode", "sample"]  # plain prompts: no continuation
    proc = subprocess.Popen([sys.executable, "-m", "casmoe", *base, "--max-prompt-tokens", "4"], cwd=d,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_limits,
                            env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"})
    deadline = time.time() + 120
    while time.time() < deadline and not (d / "r.partial.npz").exists() and proc.poll() is None:
        time.sleep(0.02)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the recording ended before it could be killed
        pass
    proc.communicate()
    if not (d / "r.partial.npz").exists():
        return "setup: no partial file was written"
    return refused(run(base + ["--max-prompt-tokens", "64"], d), d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-slow", action="store_true")
    ap.add_argument("--only", default="", help="run probes whose name or class contains this")
    ap.add_argument("--group", choices=("errors", "files", ST, BOX),
                    help="only that group's probes (default: all; the module docstring says what each holds)")
    a = ap.parse_args()
    counts: dict[str, list[int]] = {}
    chosen = {"errors": probes, "files": probes_files, ST: probes_study, BOX: probes_box,
              None: lambda: probes() + probes_files() + probes_study() + probes_box()}[a.group]()
    for pr in chosen:
        if (a.skip_slow and pr.slow) or (a.only not in pr.name and a.only not in pr.klass):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            mount = next((m for m, opts in MOUNTS.items() if any(a.startswith(f"{m}/") for a in pr.args)), None)
            if mount:
                (d / mount).mkdir()
                ok = subprocess.run(["mount", "-t", "tmpfs", "-o", MOUNTS[mount], "tmpfs", str(d / mount)],
                                    capture_output=True).returncode == 0
                if not ok:
                    print(f"{'skip':6} {pr.klass:32} {pr.name} (cannot mount a tmpfs)")
                    continue
            try:
                outcome = run_probe(pr, d)
            finally:
                if mount:
                    subprocess.run(["umount", str(d / mount)], capture_output=True)
        klass = " ".join(pr.klass.split()[:2])
        counts.setdefault(klass, [0, 0])
        counts[klass][0 if outcome else 1] += 1
        print(f"{'FAIL' if outcome else 'ok':6} {pr.klass:32} {pr.name:42} {outcome}", flush=True)
    print()
    for kind in ("traceback", "silent", NA, UE, UC, NO, PR, AD):
        mine = {k: v for k, v in counts.items() if k.startswith(kind)}
        failing = sum(1 for bad, _ in mine.values() if bad)
        probes_bad = sum(bad for bad, _ in mine.values())
        probes_all = sum(bad + good for bad, good in mine.values())
        print(f"{kind}: {failing} of {len(mine)} classes failing ({probes_bad} of {probes_all} probes)")

if __name__ == "__main__":
    main()
