"""What `casmoe bench` runs: open a model for offloading (checked to fit before any weight is
read), serve prompts under a policy, optionally verify against the un-offloaded model.

`--verify` reruns every request through the reference computation (each layer with all its
experts read from the store, one layer at a time, so the whole model is never on the device),
following the offloaded run's tokens pass for pass, and reports per request the largest
|logit difference| and the share of steps where the reference would have chosen the same
token: 0.0 and 1.0 on an exact run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from casmoe.backends import fit
from casmoe.backends.copier import EmulatedLink, responsive_copies
from casmoe.backends.experts import find_moe_blocks, model_geometry
from casmoe.backends.hostcache import HostCache
from casmoe.backends.models import experts_paths, load_tokenizer, open_files, open_model, skeleton
from casmoe.cache import Capacity, ExpertCache, MissMode
from casmoe.errors import CasmoeError
from casmoe.geometry import split_layers
from casmoe.options import CapacitySpec, one_capacity


class BenchError(CasmoeError, ValueError):
    """A bench setting that cannot work."""


@dataclass
class Opened:
    """A model ready to serve: the offloaded model, its tokenizer, the resolved capacity and RAM tier."""

    om: Any
    tokenizer: Any
    capacity: Capacity
    host: HostCache | None
    dense_bytes: int


def open_offloaded(model: str, *, devices: Sequence[str] = (), dtype: str | None = None,
                   link: EmulatedLink | None = None, capacity: str | None = None, global_capacity: str | None = None,
                   host_cache: str | None = None, host_policy: str = "lru", direct_io: bool = False) -> Opened:
    """Open `model` for offloading; every setting is checked (`fit`) before weights are read."""
    from casmoe.backends.runtime import OffloadedModel
    from casmoe.policies.spec import PolicySpec

    devs = fit.devices(list(devices))
    files = open_files(model, dtype, direct_io)
    meta = skeleton(files)
    g = model_geometry(meta, find_moe_blocks(meta))
    chunks = split_layers(g.layers, len(devs))
    cap = one_capacity(capacity, global_capacity, g)
    host = None
    if host_cache is not None:
        spec = PolicySpec.parse(host_policy)
        rows = CapacitySpec(host_cache, per_layer=False).resolve(g.bytes_per_layer()).slots
        if rows < g.top_k:
            raise BenchError(f"--host-cache {host_cache} holds {rows} experts, fewer than the {g.top_k} a token "
                             "routes to; give more memory or leave the RAM tier out")
        host = HostCache(rows, spec.check(), dict(spec.options))  # options it takes, none the runtime sets
    row = g.expert_bytes(0)
    dense = fit.dense_bytes(meta, experts_paths(meta))
    shares = _dense_shares(dense, chunks, g.layers)
    fit.check(devs, [cap.total(g.layer_slice(r)) * row for r in chunks], shares,
              0 if host is None else host.rows * row)
    ExpertCache(g.layer_slice(chunks[0]), cap)  # below top-k: the cache's own one-line error
    hf, store = open_model(files, meta)
    om = OffloadedModel(hf, store=store, devices=[str(d) for d in devs], link=link)
    return Opened(om, load_tokenizer(files), cap, host, dense)


def _dense_shares(dense: int, chunks: list[range], layers: int) -> list[int]:
    """The dense bytes each device holds, in proportion to its MoE layers (embeddings and head
    are a small part of a real model's dense weights)."""
    return [dense * len(r) // layers for r in chunks]


def bench(opened: Opened, prompts: Sequence[Any], policy: type[ExpertCache], options: dict[str, Any], *,
          miss_mode: MissMode = MissMode.LOAD, max_new_tokens: int = 32, batch: int = 1, trace: Any = None,
          verify: bool = False, progress: Callable[[int], None] | None = None,
          gating: float | None = None) -> dict[str, Any]:
    """Serve `prompts` (in groups of `batch`) and return the run's figures; with `verify`, the
    per-request comparison with the un-offloaded model under `verify` (the exact model, also
    when `gating` runs adaptive gating, `casmoe.gating`: its token agreement is the gate's cost)."""
    om = opened.om
    with responsive_copies(), om.session(policy, opened.capacity, prompts, max_new_tokens=max_new_tokens,
                                         miss_mode=miss_mode, options=options, trace=trace, host=opened.host,
                                         batch=batch, gating=gating) as session:
        for start in range(0, len(prompts), batch):
            group = prompts[start : start + batch]
            session.serve(group, max_new_tokens, keep_logits=verify, batch=batch)
            if progress is not None:
                progress(len(group))
        run = session.result()
    dtype = next(iter(om.store.layout.values()))[1]
    record = {"capacity": opened.capacity.describe(), "miss_mode": miss_mode.value, "batch": batch,
              "dtype": str(dtype).removeprefix("torch."), "dense_bytes": opened.dense_bytes,
              "host_cache_rows": None if opened.host is None else opened.host.rows, "adaptive_gating": gating,
              **run.to_dict()}
    if verify:
        record["verify"] = verify_run(om, prompts, run, max_new_tokens, batch)
        record["verify_max_abs_delta"] = max(v["max_abs_delta"] for v in record["verify"])
        record["verify_token_agreement"] = min(v["token_agreement"] for v in record["verify"])
    return record


def verify_run(om: Any, prompts: Sequence[Any], run: Any, max_new_tokens: int, batch: int) -> list[dict[str, Any]]:
    """Per request: max |offloaded - reference logit| over its steps, and the share of steps at
    which the reference's argmax is the offloaded run's token (see the module docstring)."""
    tokens = [t.new_tokens for t in run.requests]
    ref = om.reference(prompts, max_new_tokens, keep_logits=True, batch=batch, follow=tokens)
    out = []
    for got, want, toks in zip(run.logits, ref.logits, tokens):
        delta = max(float((a.float() - b.float().to(a.device)).abs().max()) for a, b in zip(got, want))
        agree = sum(int(b.argmax()) == t for b, t in zip(want, toks)) / len(toks)
        out.append({"max_abs_delta": delta, "token_agreement": agree, "steps": len(toks)})
    return out
