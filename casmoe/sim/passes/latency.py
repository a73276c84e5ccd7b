"""Latency bookkeeping of a run: per request (arrival, admission, first token, finish) and per
decode step, turned into the percentiles users ask for.

- TTFT: first token - arrival (queueing and prefill included);
- TPOT: per request, (finish - first token) / tokens after the first;
- end-to-end: finish - arrival; queue wait: admission - arrival;
- token latency: the duration of each decode step (all the tokens it produces share it);
- queue length over time: (time, waiting requests) at every change.
"""

from __future__ import annotations

from typing import Any, Sequence

from casmoe.sim.passes.result import percentiles


class LatencyLog:
    def __init__(self) -> None:
        self.arrival: dict[int, float] = {}
        self.admitted: dict[int, float] = {}
        self.ttft: dict[int, float] = {}  # in the order first tokens came out
        self.finish: dict[int, float] = {}
        self.after_first: dict[int, int] = {}  # tokens after the first, per request
        self.token_latency: list[float] = []
        self.decode_time = 0.0
        self.decode_tokens = 0
        self.prefill_tokens = 0
        self.decode_steps = 0
        self.queue: list[tuple[float, int]] = []
        self.peak_running = 0  # most requests admitted at once

    def arrive(self, r: int, t: float) -> None:
        self.arrival[r] = t

    def admit(self, r: int, t: float, running: int) -> None:
        """`r` joins the running requests (`running` of them now) at `t`."""
        self.admitted[r] = t
        if running > self.peak_running:
            self.peak_running = running

    def queue_length(self, t: float, waiting: int) -> None:
        if self.queue and self.queue[-1][0] == t:
            self.queue[-1] = (t, waiting)
        else:
            self.queue.append((t, waiting))

    def prefilled(self, r: int, tokens: int, t: float, first_token: bool = True) -> None:
        """`tokens` of `r`'s prompt were computed by `t`; with its last chunk, its first token."""
        self.prefill_tokens += tokens
        if first_token:
            self.ttft[r] = t - self.arrival[r]

    def decoded(self, start: float, t: float, requests: Sequence[int]) -> None:
        """A decode step of `requests` (one token each) ran from `start` to `t`."""
        self.token_latency.append(t - start)
        self.decode_time += t - start
        self.decode_tokens += len(requests)
        self.decode_steps += 1
        for r in requests:
            if r in self.ttft:
                self.after_first[r] = self.after_first.get(r, 0) + 1
            else:
                self.ttft[r] = t - self.arrival[r]

    def decoded_alone(self, r: int, starts: Sequence[float], ends: Sequence[float]) -> None:
        """`decoded(starts[i], ends[i], [r])` for each of `r`'s consecutive decode steps (run
        alone), in order: the same sums in the same order, without a call per step."""
        lat = [t - t0 for t0, t in zip(starts, ends)]
        self.token_latency += lat
        total = self.decode_time
        for d in lat:
            total += d
        self.decode_time = total
        self.decode_tokens += len(lat)
        self.decode_steps += len(lat)
        if r not in self.ttft:
            self.ttft[r] = ends[0] - self.arrival[r]
            lat = lat[1:]
        if lat:
            self.after_first[r] = self.after_first.get(r, 0) + len(lat)

    def finished(self, r: int, t: float) -> None:
        self.finish[r] = t

    def summary(self, end: float) -> dict[str, Any]:
        """Percentiles and rates as `SimResult` fields; `end` is the run's makespan."""
        ttft = list(self.ttft.values())
        p50, p90, p99 = percentiles(self.token_latency, (50, 90, 99))
        t50, t90, t99 = percentiles(ttft, (50, 90, 99))
        e2e = [self.finish[r] - self.arrival[r] for r in self.finish]
        tpot = [
            (self.finish[r] - self.arrival[r] - self.ttft[r]) / n for r, n in self.after_first.items() if r in self.finish
        ]
        wait = [self.admitted[r] - self.arrival[r] for r in self.admitted]
        e50, e90, e99 = percentiles(e2e, (50, 90, 99))
        o50, o90, o99 = percentiles(tpot, (50, 90, 99))
        (w99,) = percentiles(wait, (99,))
        return dict(
            prefill_tokens=self.prefill_tokens,
            decode_tokens=self.decode_tokens,
            ttft_mean_s=sum(ttft) / len(ttft) if ttft else 0.0,
            ttft_p50_s=t50,
            ttft_p90_s=t90,
            ttft_p99_s=t99,
            token_latency_mean_s=self.decode_time / len(self.token_latency) if self.token_latency else 0.0,
            token_latency_p50_s=p50,
            token_latency_p90_s=p90,
            token_latency_p99_s=p99,
            decode_tokens_per_s=self.decode_tokens / self.decode_time if self.decode_time else 0.0,
            tpot_mean_s=sum(tpot) / len(tpot) if tpot else 0.0,
            tpot_p50_s=o50,
            tpot_p90_s=o90,
            tpot_p99_s=o99,
            e2e_mean_s=sum(e2e) / len(e2e) if e2e else 0.0,
            e2e_p50_s=e50,
            e2e_p90_s=e90,
            e2e_p99_s=e99,
            queue_wait_mean_s=sum(wait) / len(wait) if wait else 0.0,
            queue_wait_p99_s=w99,
            requests_per_s=len(self.finish) / end if end else 0.0,
            throughput_tokens_per_s=self.decode_tokens / end if end else 0.0,
            mean_batch=self.decode_tokens / self.decode_steps if self.decode_steps else 0.0,
            peak_batch=self.peak_running,
            queue_mean=_time_average(self.queue, end),
            queue_max=max((n for _, n in self.queue), default=0),
            queue_length=tuple(self.queue),
        )


def _time_average(series: Sequence[tuple[float, int]], end: float) -> float:
    """Mean of a step function given as (time, value) change points, over [0, end]."""
    if not series or end <= 0:
        return 0.0
    area = 0.0
    for (t0, n), (t1, _) in zip(series, [*series[1:], (end, 0)]):
        area += n * (max(t1, t0) - t0)
    return area / end
