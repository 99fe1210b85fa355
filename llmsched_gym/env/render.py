"""Rendering of ``LLMSched-v1``: ``ansi`` text and a small ``rgb_array`` picture (numpy only)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from llmsched_gym.core.engine import Engine
    from llmsched_gym.env.decision import DecisionPoint

BAR = 40
HEIGHT, WIDTH = 96, 256
SHOWN = 8


def render_ansi(e: Engine | None, dp: DecisionPoint, forming: bool) -> str:
    """Clock, KV bar, the batch being formed (``forming``: the episode goes on), the first slots
    and the running requests of engine ``e`` and decision point ``dp``."""
    if e is None:
        return "LLMSched-v1: call reset() first\n"
    cap = e.kv.capacity_tokens
    used = e.kv.used_tokens
    reserved = dp.sel_blocks * e.kv.block_size if forming else 0
    n_used = min(BAR, round(BAR * used / cap))
    n_res = min(BAR - n_used, round(BAR * reserved / cap))
    bar = "#" * n_used + "+" * n_res + "." * (BAR - n_used - n_res)
    lines = [
        f"t={e.clock:.3f}s  iteration {e.n_iterations}  completed {e.n_completed}/{e.n}"
        f"  waiting {len(e.waiting)}  running {len(e.running)}",
        f"KV [{bar}] {used}/{cap} tokens ({used / cap:.0%})" + (f", +{reserved} chosen" if reserved else ""),
    ]
    if dp.sel:
        lines.append(f"batch being formed: {dp.sel[:SHOWN]}" + (" ..." if len(dp.sel) > SHOWN else ""))
    lines.append("slot  request  prompt  pred_out  age_s   ok")
    wl = e.workload
    for s, rid in enumerate(dp.slots[:SHOWN]):
        lines.append(
            f"{s:>4}  {rid:>7}  {int(dp.target[rid]):>6}  {int(wl.predicted_output[rid]):>8}"
            f"  {e.clock - wl.arrival_s[rid]:>5.2f}  {'yes' if dp.ok[s] else 'no'}"
        )
    if len(dp.slots) > SHOWN:
        lines.append(f"      ... {len(dp.slots) - SHOWN} more slots, {len(e.waiting)} waiting in all")
    run = e.running[:SHOWN]
    if run:
        desc = ", ".join(f"{r}({int(e.generated[r])}/{int(wl.predicted_output[r])})" for r in run)
        lines.append(f"running (generated/predicted): {desc}" + (" ..." if len(e.running) > SHOWN else ""))
    return "\n".join(lines) + "\n"


def render_rgb(history: list[tuple[float, float, int]]) -> np.ndarray:
    """A ``HEIGHT x WIDTH x 3`` uint8 picture of ``history`` (``(clock, KV used / capacity, queue
    length)`` at every decision, the env driver's): KV usage (green, top) and queue length (blue,
    bottom, log scale) at the last ``WIDTH`` decisions, oldest on the left; a red line marks the
    KV capacity."""
    img = np.full((HEIGHT, WIDTH, 3), 255, np.uint8)
    hist = history[-WIDTH:]
    half = HEIGHT // 2
    img[half - 1, :] = (200, 200, 200)
    top = half - 8  # rows for KV in [0, 1], the rest shows overflow up to ~1.15
    img[half - 1 - top, :] = (220, 40, 40)
    if not hist:
        return img
    kv = np.array([h[1] for h in hist])
    q = np.array([h[2] for h in hist], dtype=float)
    q_scale = np.log1p(max(q.max(), 1.0))
    for x, (k_frac, q_len) in enumerate(zip(kv, q, strict=True)):
        h_kv = int(min(k_frac, (half - 2) / top) * top)
        if h_kv:
            img[half - 1 - h_kv:half - 1, x] = (40, 160, 60)
        h_q = int(np.log1p(q_len) / q_scale * (HEIGHT - half - 2))
        if h_q:
            img[half + 1:half + 1 + h_q, x] = (50, 90, 200)
    return img
