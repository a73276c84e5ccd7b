"""Synthetic routing traces with known structure, for tests and what-if studies.

Real traces are few and small; a generator whose knobs each switch on one property of real
routing lets a study ask "how much does policy X gain from property Y" with everything else
fixed. The routing model, per MoE layer `l`:

- **popularity** `p_l`: Zipf over a random permutation of the experts, `p(rank r) ~ 1 / r^zipf`
  (`zipf=0` is uniform). Real routers are skewed and differently so at each layer.
- **task clusters**: each task has, per layer, a preferred set of `task_experts` experts drawn
  at random; a request of that task routes from `q = (1 - task_affinity) * p_l +
  task_affinity * uniform(preferred set)`. This is the structure prompt-level prediction
  (CasMoE's planner) exploits: same task, similar prompt, similar experts.
- **stickiness**: at every token after the first, each of the previous token's `k` experts at
  that layer is kept with probability `stickiness`; the remaining slots are drawn fresh from
  `q` (without replacement). This is the temporal locality LRU-like caches exploit.

Draws use Gumbel-top-k on `log q`, which samples k distinct experts with probabilities `q`;
the perturbed scores double as router *logits* (kept experts are lifted above the rest so that
`topk` is always the top-k of the stored logits), and the weights are the softmax of the
chosen logits renormalised over the k (Mixtral style), rounded to 1/256 so the shipped file
stays small. `spec` (what layer l+1's router would pick from layer l's hidden state) equals the
true next-layer experts slot by slot with probability `spec_accuracy`, else a wrong expert.

Prompts are generated from per-task templates and word pools that share almost no vocabulary
between tasks, so sentence embeddings of prompts cluster by task as real prompts would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from casmoe.errors import CasmoeError
from casmoe.geometry import Geometry
from casmoe.resources import check_allocation
from casmoe.trace import NOT_COMPUTED, Request, Trace

WEIGHT_STEP = 1.0 / 256
"""Router weights are rounded to this grid: plenty for caches, and it keeps files compressible."""


class SynthError(CasmoeError, ValueError):
    """Generator knobs outside their range."""


# ---- prompts ---------------------------------------------------------------------------------

_TASKS: dict[str, dict[str, list[str]]] = {
    "code": {
        "t": [
            "How do I {v} a {n} in {x}?",
            "Write a {x} function that can {v} a {n}.",
            "Why does my {x} code fail to {v} the {n}?",
            "Explain how to {v} a {n} using {x} and its standard library.",
            "What is the fastest way to {v} a large {n} in {x}?",
            "Refactor this {x} snippet so that it can {v} each {n}.",
        ],
        "v": ["parse", "serialize", "sort", "reverse", "cache", "debug", "compile", "iterate over", "hash",
              "deserialize", "profile", "unit test"],
        "n": ["linked list", "JSON object", "binary tree", "hash map", "regex pattern", "HTTP request",
              "byte buffer", "class hierarchy", "async iterator", "stack trace", "SQL query", "git branch"],
        "x": ["Python", "Rust", "JavaScript", "C++", "Go", "TypeScript", "Java", "Haskell"],
    },
    "math": {
        "t": [
            "Prove that the {n} of a {x} is {v}.",
            "How do I compute the {n} of a {x}?",
            "Show step by step why every {x} has a {v} {n}.",
            "What is the {n} of the {x} defined by this equation?",
            "Explain the theorem about the {v} {n} of a {x}.",
            "Solve for the {n} of a {x} when it is {v}.",
        ],
        "v": ["finite", "unique", "bounded", "positive", "irrational", "convergent", "symmetric", "invertible",
              "orthogonal", "prime"],
        "n": ["determinant", "eigenvalue", "derivative", "integral", "limit", "gradient", "variance",
              "greatest common divisor", "Taylor series", "characteristic polynomial"],
        "x": ["matrix", "polynomial", "triangle", "sequence", "random variable", "vector space",
              "quadratic equation", "differentiable function", "group", "geometric series"],
    },
    "cooking": {
        "t": [
            "How long should I {v} the {n} for a {x}?",
            "Give me a recipe to {v} {n} for a {x}.",
            "Can I {v} the {n} ahead of time when making a {x}?",
            "What spices go well when you {v} {n} in a {x}?",
            "My {x} came out dry; should I {v} the {n} differently?",
            "Suggest a vegetarian way to {v} {n} for a {x}.",
        ],
        "v": ["roast", "simmer", "marinate", "bake", "braise", "saute", "grill", "knead", "caramelize",
              "poach", "whisk", "season"],
        "n": ["chicken thighs", "garlic", "sourdough", "salmon fillet", "onions", "lentils", "eggplant",
              "puff pastry", "basmati rice", "mushrooms", "butter", "tomatoes"],
        "x": ["weeknight dinner", "stew", "lasagna", "curry", "birthday cake", "risotto", "picnic",
              "holiday roast", "soup", "stir fry"],
    },
    "travel": {
        "t": [
            "What is the best way to {v} when visiting {x} with a {n}?",
            "Plan a week in {x}: where should I {v} and do I need a {n}?",
            "Is it safe to {v} in {x} without a {n}?",
            "How much does a {n} cost in {x} if I want to {v}?",
            "Recommend places to {v} in {x} and tips for the {n}.",
            "I land in {x} at night; how do I {v} and find a {n}?",
        ],
        "v": ["get around", "go hiking", "book a hostel", "rent a car", "sightsee", "go backpacking",
              "take the train", "find cheap flights", "exchange currency", "go snorkeling"],
        "n": ["visa", "rail pass", "travel insurance", "tour guide", "hotel room", "ferry ticket",
              "backpack", "local SIM card", "airport shuttle", "passport"],
        "x": ["Japan", "Portugal", "Peru", "Iceland", "Morocco", "Vietnam", "New Zealand", "Italy", "Kenya",
              "Norway"],
    },
    "medicine": {
        "t": [
            "What are the symptoms of {n} and when should a patient {v}?",
            "Is it safe to take {x} for {n}?",
            "How does {x} treat {n} and what side effects should I {v}?",
            "My doctor prescribed {x} for {n}; should I {v}?",
            "Explain the diagnosis of {n} and whether to {v}.",
            "What dose of {x} is typical for {n} before you {v}?",
        ],
        "v": ["see a doctor", "get a blood test", "stop the medication", "watch for", "go to the emergency room",
              "get vaccinated", "check blood pressure", "schedule a biopsy"],
        "n": ["migraine", "type 2 diabetes", "hypertension", "asthma", "pneumonia", "anemia", "arthritis",
              "a thyroid disorder", "an infection", "high cholesterol"],
        "x": ["ibuprofen", "metformin", "amoxicillin", "insulin", "a statin", "an antihistamine",
              "a beta blocker", "corticosteroids"],
    },
    "law": {
        "t": [
            "Can my {x} {v} if the {n} was never signed?",
            "What does the {n} clause mean when a {x} wants to {v}?",
            "Is it legal for a {x} to {v} without a {n}?",
            "How do I respond when a {x} threatens to {v} over the {n}?",
            "Explain the liability of a {x} who tries to {v} under the {n}.",
            "Under contract law, may a {x} {v} after the {n} expires?",
        ],
        "v": ["sue", "terminate the lease", "file a claim", "enforce the contract", "appeal the ruling",
              "evict the tenant", "withhold payment", "seek damages"],
        "n": ["lease agreement", "non-compete", "warranty", "will", "settlement", "power of attorney",
              "copyright license", "employment contract", "court order", "deed"],
        "x": ["landlord", "employer", "tenant", "contractor", "plaintiff", "defendant", "trustee",
              "shareholder"],
    },
    "finance": {
        "t": [
            "Should I {v} my {n} before the {x}?",
            "How is a {n} taxed when I {v} during a {x}?",
            "Explain how to {v} a {n} in a {x}.",
            "Is it wise to {v} a {n} if a {x} is coming?",
            "What fees apply when you {v} a {n} during a {x}?",
            "Compare ways to {v} my {n} given the {x}.",
        ],
        "v": ["refinance", "diversify", "rebalance", "pay off", "invest in", "sell", "hedge", "consolidate"],
        "n": ["mortgage", "index fund portfolio", "retirement account", "credit card debt", "bond ladder",
              "stock options", "savings account", "student loan"],
        "x": ["recession", "rate hike", "bull market", "tax year end", "market crash", "inflation spike",
              "job change", "home purchase"],
    },
    "music": {
        "t": [
            "How do I {v} a {n} on the {x}?",
            "What exercises help me {v} {n} on {x}?",
            "Teach me to {v} the {n} for a song on {x}.",
            "Why does my {x} sound off when I {v} a {n}?",
            "Suggest practice routines to {v} {n} on the {x}.",
            "Which scales help to {v} a {n} on {x}?",
        ],
        "v": ["play", "tune", "improvise over", "transpose", "strum", "memorize", "sight read", "harmonize"],
        "n": ["chord progression", "minor scale", "arpeggio", "blues riff", "jazz standard", "melody",
              "syncopated rhythm", "power chord"],
        "x": ["guitar", "piano", "violin", "bass", "ukulele", "saxophone", "drums", "cello"],
    },
}

TASKS: tuple[str, ...] = tuple(_TASKS)
"""Task names with prompt templates, in the order `tasks=n` takes them."""


def make_prompt(task: str, rng: np.random.Generator) -> str:
    """One prompt of `task`: a template filled from the task's own word pools."""
    pools = _TASKS[task]
    template = pools["t"][rng.integers(len(pools["t"]))]
    fill = {key: words[rng.integers(len(words))] for key, words in pools.items() if key != "t"}
    return template.format(**fill)


# ---- routing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SynthConfig:
    """Knobs of the generator; see the module docstring for the routing model they drive."""

    requests: int = 300
    tasks: int = 6
    zipf: float = 1.0
    stickiness: float = 0.3
    task_affinity: float = 0.6
    task_experts: int | None = None
    """Size of a task's preferred set per layer; default `min(E, max(2k, E // 4))`."""
    prefill: tuple[int, int] = (16, 64)
    decode: tuple[int, int] = (32, 96)
    logits: bool = False
    spec: bool = False
    spec_accuracy: float = 0.8
    seed: int = 0
    meta: dict = field(default_factory=dict, compare=False)

    def check(self, geometry: Geometry) -> None:
        if self.requests < 1:
            raise SynthError(f"requests must be >= 1 (a trace with no request measures nothing), got {self.requests}")
        if not 1 <= self.tasks <= len(TASKS):
            raise SynthError(f"tasks must be in [1, {len(TASKS)}] (known: {', '.join(TASKS)})")
        if self.zipf < 0:
            raise SynthError("zipf must be >= 0")
        for name in ("stickiness", "task_affinity", "spec_accuracy"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise SynthError(f"{name} must be in [0, 1]")
        if self.task_experts is not None and not geometry.top_k <= self.task_experts <= geometry.experts:
            raise SynthError(f"task_experts must be in [top_k={geometry.top_k}, experts={geometry.experts}]")
        for name in ("prefill", "decode"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                raise SynthError(f"{name} range must satisfy 0 <= low <= high (got {lo}..{hi})")
        if self.prefill[1] + self.decode[1] == 0 and self.requests:
            raise SynthError("requests need at least one token: prefill or decode high must be > 0")

        tokens = self.requests * (self.prefill[1] + self.decode[1])  # at most
        per_token = geometry.layers * (geometry.top_k * 16 + (geometry.experts * 8 if self.logits else 0))
        check_allocation(tokens * per_token, f"a synthetic trace of up to {tokens} tokens ({geometry.describe()})")


def zipf_popularity(geometry: Geometry, s: float, rng: np.random.Generator) -> np.ndarray:
    """[L, E] routing probabilities: Zipf(s) over a fresh random expert order per layer."""
    L, E = geometry.layers, geometry.experts
    ranked = 1.0 / np.arange(1, E + 1, dtype=np.float64) ** s
    ranked /= ranked.sum()
    pop = np.empty((L, E))
    for layer in range(L):
        pop[layer, rng.permutation(E)] = ranked
    return pop


def task_distributions(pop: np.ndarray, cfg: SynthConfig, k: int, rng: np.random.Generator) -> np.ndarray:
    """[tasks, L, E]: each task's routing distribution, popularity mixed with its preferred set."""
    L, E = pop.shape
    m = cfg.task_experts or min(E, max(2 * k, E // 4))
    out = np.empty((cfg.tasks, L, E))
    for t in range(cfg.tasks):
        pref = np.zeros((L, E))
        for layer in range(L):
            pref[layer, rng.choice(E, size=m, replace=False)] = 1.0 / m
        out[t] = (1 - cfg.task_affinity) * pop + cfg.task_affinity * pref
    return out


def route_request(
    logq: np.ndarray, tokens: int, k: int, stickiness: float | np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """topk [T, L, k] (descending weight), weights [T, L, k], logits [T, L, E] for one request
    routed from log-probabilities `logq[L, E]` (or one per token, `[T, L, E]`) with
    `stickiness` (a scalar or one per layer). A negative stickiness repels: each of the previous
    token's experts is left out of the next draw with probability -stickiness."""
    L, E = logq.shape[-2:]
    with np.errstate(divide="ignore"):
        z = (logq if logq.ndim == 3 else logq[None]) + rng.gumbel(size=(tokens, L, E))  # [T, L, E]
    sticky = np.broadcast_to(np.asarray(stickiness, dtype=np.float64).reshape(-1, 1), (L, k))
    keep = rng.random((tokens, L, k)) < np.abs(sticky)  # [T, L, k]
    repel = sticky < 0
    rows = np.arange(L)[:, None]
    topk = np.empty((tokens, L, k), dtype=np.int64)
    for t in range(tokens):
        zt = z[t]  # [L, E]
        if t and sticky.any():
            kept = np.where(keep[t], topk[t - 1], -1)  # [L, k]
            lift = zt.max(axis=1, keepdims=True) + 1.0 + rng.exponential(size=(L, k))
            if repel.any():  # sink below every other expert instead
                lift = np.where(repel, zt.min(axis=1, keepdims=True) - lift + zt.max(axis=1, keepdims=True), lift)
            mask = kept >= 0
            zt[np.broadcast_to(rows, kept.shape)[mask], kept[mask]] = lift[mask]
        topk[t] = np.argsort(-zt, axis=1, kind="stable")[:, :k]
    chosen = np.take_along_axis(z, topk, axis=2)  # [T, L, k]
    w = np.exp(chosen - chosen.max(axis=2, keepdims=True))
    w /= w.sum(axis=2, keepdims=True)
    w = np.round(w / WEIGHT_STEP) * WEIGHT_STEP
    return topk, w.astype(np.float32), z.astype(np.float32)


def _speculate(topk: np.ndarray, accuracy: float, pop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """spec [T, L, k]: layer l+1's experts, each slot wrong with probability 1 - accuracy."""
    T, L, k = topk.shape
    E = pop.shape[1]
    spec = np.full_like(topk, NOT_COMPUTED)
    if L < 2 or T == 0:
        return spec
    truth = topk[:, 1:]  # [T, L-1, k]
    with np.errstate(divide="ignore"):
        z = np.log(pop[1:])[None] + rng.gumbel(size=(T, L - 1, E))
    np.put_along_axis(z, truth, -np.inf, axis=2)
    pool = np.argsort(-z, axis=2, kind="stable")[:, :, :k]  # distinct wrong experts
    wrong = rng.random((T, L - 1, k)) >= accuracy
    wrong[:, :, E - k :] = False  # fewer than k wrong experts exist when E < 2k
    spec[:, :-1] = np.where(wrong, pool, truth)
    return spec


def generate(geometry: Geometry, cfg: SynthConfig) -> Trace:
    """A synthetic trace of `cfg.requests` requests, reproducible from `cfg.seed`."""
    cfg.check(geometry)
    rng = np.random.default_rng(cfg.seed)
    k = geometry.top_k
    pop = zipf_popularity(geometry, cfg.zipf, rng)
    dist = task_distributions(pop, cfg, k, rng)
    with np.errstate(divide="ignore"):
        logdist = np.log(dist)
    requests = []
    for _ in range(cfg.requests):
        t = int(rng.integers(cfg.tasks))
        prefill = int(rng.integers(cfg.prefill[0], cfg.prefill[1] + 1))
        decode = int(rng.integers(cfg.decode[0], cfg.decode[1] + 1))
        if prefill + decode == 0:
            decode = 1
        topk, weights, logits = route_request(logdist[t], prefill + decode, k, cfg.stickiness, rng)
        requests.append(
            Request(
                topk=topk.astype(np.int16),
                weights=weights,
                prefill=prefill,
                prompt=make_prompt(TASKS[t], rng),
                task=TASKS[t],
                logits=logits if cfg.logits else None,
                spec=_speculate(topk, cfg.spec_accuracy, pop, rng).astype(np.int16) if cfg.spec else None,
            )
        )
    meta = {
        "source_model": "synthetic",
        "recorded_by": "casmoe.synthetic",
        "synth": {
            "requests": cfg.requests,
            "tasks": list(TASKS[: cfg.tasks]),
            "zipf": cfg.zipf,
            "stickiness": cfg.stickiness,
            "task_affinity": cfg.task_affinity,
            "task_experts": cfg.task_experts,
            "prefill": list(cfg.prefill),
            "decode": list(cfg.decode),
            "logits": cfg.logits,
            "spec": cfg.spec,
            "spec_accuracy": cfg.spec_accuracy,
            "seed": cfg.seed,
        },
        **cfg.meta,
    }
    return Trace(geometry, requests, meta)
