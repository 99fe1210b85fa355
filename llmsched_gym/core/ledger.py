"""The memory ledger: one place that answers how many KV blocks an iteration needs.

Every part of the simulator that asks "does this batch fit, what must be preempted, what will it
need" asks this module: the engine before it runs an iteration (:meth:`Ledger.iteration`,
:meth:`Ledger.victims`), the batch former shared by the engine policies and the env
(:class:`~llmsched_gym.core.batching.BatchBuilder`), the env's decision point (its masks and
admission rule) and the plan repair of the baselines (:meth:`Ledger.shortfall`). One rule, so that
a policy's estimate and the engine's verdict cannot drift apart.

The rule, in blocks of ``block_size`` tokens (``block_size = 1`` is the papers' token-level
model; the engine's :class:`~llmsched_gym.core.kv.KVCache` counts the same way):

* a request holding ``k`` KV tokens holds ``blocks(k) = ceil(k / block_size)`` blocks, of which its
  first ``kv.shared[rid]`` may be prefix-cache blocks shared with other requests;
* a decode adds a block exactly when the request's last block is full (``k % block_size == 0``);
  every running request whose prefill is complete decodes in lockstep, one token per iteration;
* a prefill chunk of ``c`` tokens on top of ``k`` adds ``blocks(k + c + e) - blocks(k)``, where
  ``e = 1`` on the final chunk when prefill emits output token 1 (real engines) and 0 otherwise;
* an admission first takes its prefix-cache hit (the matched head blocks, which become used when
  they were idle) or, after a swap preemption, its swapped-out KV back (``blocks(k)``);
* a preemption frees the victim's blocks except the shared prefix blocks that another running
  request still references (those it alone held become idle: cached, counted as free).

Some callers ask on purpose for a cruder figure than the exact one, and the ledger names each:
:meth:`Ledger.admission` charges an admission its hit blocks as if newly allocated and
:meth:`Ledger.held` counts shared blocks as freed (the batch former's rule), :meth:`Ledger.own`
leaves shared blocks out and :meth:`Ledger.whole_prompt` ignores prefix hits (the decision point's).
The exact verdict (:meth:`Ledger.shortfall`, :meth:`Ledger.victims`) replays the prefix cache's
reference counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from llmsched_gym.core.scheduler import BatchPlan, PlanError

if TYPE_CHECKING:
    from llmsched_gym.core.kv import KVCache

WAITING, RUNNING = 1, 2

Chunk = tuple[int, int, bool]
"""``(request id, prompt tokens this iteration, whether it is the prompt's final chunk)``."""


class Ledger:
    """The KV-block accounting of one engine (see the module docstring).

    :param kv: the engine's KV cache (capacity, blocks in use, prefix cache).
    :param prefill_emits_token: the final prefill chunk stores output token 1 too.
    :param state: per-request state array (1 waiting, 2 running).
    :param prefilled: per-request prompt tokens whose KV is computed.
    :param prefill_target: per-request tokens to prefill at (re)admission.
    :param kv_tokens: per-request KV tokens held.
    :param generated: per-request output tokens produced.
    :param swapped: per-request flag: the KV is swapped out to host memory.
    :param prompt_tokens: per-request prompt length.
    :param preempt_mode: what a preemption does to a request's progress (``recompute``,
        ``restart`` or ``swap``; see :class:`~llmsched_gym.core.engine.EngineConfig`).

    The arrays are the engine's own (read, never written), indexed by request id: the ledger always
    sees the current state. An engine given requests at run time passes its buffers, which may have
    rows past its last request. Build it with :meth:`of` from an engine.
    """

    __slots__ = ("kv", "bs", "emit", "state", "prefilled", "target", "kvt", "gen", "swapped", "prompt",
                 "preempt_mode")

    def __init__(self, kv: KVCache, prefill_emits_token: bool, state: np.ndarray, prefilled: np.ndarray,
                 prefill_target: np.ndarray, kv_tokens: np.ndarray, generated: np.ndarray, swapped: np.ndarray,
                 prompt_tokens: np.ndarray, preempt_mode: str = "recompute") -> None:
        self.kv = kv
        self.bs = kv.block_size
        self.emit = 1 if prefill_emits_token else 0
        self.state, self.prefilled, self.target, self.kvt = state, prefilled, prefill_target, kv_tokens
        self.gen, self.swapped, self.prompt = generated, swapped, prompt_tokens
        self.preempt_mode = preempt_mode

    @classmethod
    def of(cls, engine) -> Ledger:
        """The ledger of ``engine`` (an :class:`~llmsched_gym.core.engine.Engine`)."""
        return cls(engine.kv, engine.config.prefill_emits_token, engine._state, engine._prefilled,
                   engine._prefill_target, engine._kv_tokens, engine._generated, engine._swapped,
                   engine._prompt, engine.config.preempt_mode)

    # ---- the rule, per request ------------------------------------------------------------------
    def blocks(self, tokens):
        """Blocks that hold ``tokens`` tokens (an int, or element-wise on an integer array)."""
        return -(-tokens // self.bs)

    def step(self, k0: int, chunk: int, last: bool) -> int:
        """Blocks added when a request holding ``k0`` tokens prefills ``chunk`` more, storing output
        token 1 too when ``last`` and prefill emits it."""
        bs = self.bs
        return -(-(k0 + chunk + (self.emit if last else 0)) // bs) - -(-k0 // bs)

    def chunk(self, rid: int, start: int, chunk: int) -> int:
        """Blocks added when ``rid`` prefills ``chunk`` tokens on top of ``start`` computed ones (the
        final chunk when it reaches the request's prefill target)."""
        last = start + chunk >= int(self.target[rid])
        bs = self.bs
        end = start + chunk + (self.emit if last else 0)
        return -(-end // bs) - -(-start // bs)

    def decode(self, rid: int) -> int:
        """Blocks a decode step of ``rid`` allocates (1 when its last block is full)."""
        return 1 if int(self.kvt[rid]) % self.bs == 0 else 0

    def owed(self, rid: int) -> int:
        """Blocks running ``rid``'s unfinished prefill still adds (0 when its prefill is complete)."""
        left = int(self.target[rid] - self.prefilled[rid])
        return self.chunk(rid, int(self.kvt[rid]), left) if left > 0 else 0

    def growth(self, rid: int) -> int:
        """Blocks running ``rid`` adds if it runs to the end of its prefill (its owed blocks) or,
        when its prefill is complete, decodes once."""
        kvt = int(self.kvt[rid])
        left = int(self.target[rid] - self.prefilled[rid])
        if left > 0:
            bs = self.bs
            return -(-(kvt + left + self.emit) // bs) - -(-kvt // bs)
        return 1 if kvt % self.bs == 0 else 0

    def held(self, rid: int) -> int:
        """Blocks ``rid`` holds now, shared prefix blocks included."""
        return -(-int(self.kvt[rid]) // self.bs)

    def own(self, rid: int) -> int:
        """Blocks ``rid`` holds that no other request shares (freed for sure by its preemption)."""
        return -(-int(self.kvt[rid]) // self.bs) - int(self.kv.shared[rid])

    def admission(self, rid: int, hit: int, chunk: int | None = None) -> int:
        """Blocks waiting ``rid`` is charged when admitted with a prefix hit of ``hit`` tokens and a
        first chunk of ``chunk`` tokens (``None``: the rest of its prompt): the chunk's growth plus
        the hit's blocks, counted as if newly allocated (an upper bound: idle cached blocks are)."""
        left = int(self.target[rid]) - hit
        return self.chunk(rid, hit, left if chunk is None else chunk) + hit // self.bs

    # ---- the rule, element-wise on arrays (the env's decision point) -----------------------------
    def whole_prompt(self, target: np.ndarray) -> np.ndarray:
        """Blocks of a prefill of ``target`` tokens from nothing, with output token 1 when prefill
        emits it (element-wise): what an admission of the whole prompt holds after its iteration."""
        return (target + (self.emit + self.bs - 1)) // self.bs

    def running_growth(self, kvt: np.ndarray, left: np.ndarray | None = None,
                       mids: list[tuple[int, int]] | None = None) -> int:
        """Blocks the running requests with KV ``kvt`` add when each decodes once (``left == 0``)
        or runs its unfinished prefill (``left`` tokens owed) to the end (:meth:`growth`, summed).
        ``left=None`` (and no ``mids``): every one of them decodes. ``mids`` instead of ``left``:
        the ``(KV tokens, tokens owed)`` of each unfinished prefill, when the caller has them
        (the same count: the decodes' new blocks counted over all of ``kvt`` with a correction
        for each of the few prefills, instead of a formula per element)."""
        bs, emit = self.bs, self.emit
        if mids is not None:
            if bs == 1:  # a decode adds 1, a prefill what it owes (and token 1 when prefill emits it)
                return len(kvt) + sum(c for _, c in mids) - (0 if emit else len(mids))
            # a decode adds a block when its last one is full; an unfinished prefill stores the
            # rest of its prompt and token 1 if emitted (:meth:`step` of its final chunk)
            grow = len(kvt) - int(np.count_nonzero(kvt % bs))
            for k, c in mids:
                grow += -(-(k + c + emit) // bs) - -(-k // bs) - (k % bs == 0)
            return grow
        if left is None:
            return len(kvt) if bs == 1 else int(np.count_nonzero(kvt % bs == 0))
        if bs == 1:
            return len(kvt) + int(left.sum()) - (0 if emit else int(np.count_nonzero(left)))
        # a decode stores one token; an unfinished prefill the rest of its prompt and token 1 if emitted
        end = kvt + left
        end += bs if emit else bs - (left > 0)
        return int((end // bs - (kvt + (bs - 1)) // bs).sum())

    # ---- one iteration of the engine -----------------------------------------------------------
    def iteration(self, prefill: list[tuple[int, int]], dec: np.ndarray, lockstep_cnt: list[int] | None = None,
                  step: int = 0) -> tuple[list[Chunk], int]:
        """One engine iteration: the plan's prefill entries ``(rid, chunk)`` of admitted requests
        (``0`` or more than remains: the rest of the prompt) as ``(rid, tokens, last)`` chunks, and
        the blocks the chunks and the decodes of ``dec`` allocate (:meth:`decodes`)."""
        emit, bs = self.emit, self.bs
        out: list[Chunk] = []
        grow = 0
        if prefill:
            kvt, pre, tgt = self.kvt, self.prefilled, self.target
            for rid, chunk in prefill:
                remaining = int(tgt[rid] - pre[rid])
                c = remaining if chunk == 0 or chunk > remaining else chunk
                last = c == remaining
                k0 = int(kvt[rid])
                grow += -(-(k0 + c + (emit if last else 0)) // bs) - -(-k0 // bs)
                out.append((rid, c, last))
        if len(dec):
            if bs == 1:
                grow += len(dec)
            elif lockstep_cnt is not None:
                grow += lockstep_cnt[step % bs]
            else:
                grow += int(np.count_nonzero(self.kvt[dec] % bs == 0))
        return out, grow

    def decodes(self, dec: np.ndarray, lockstep_cnt: list[int] | None = None, step: int = 0) -> int:
        """Blocks one decode iteration of requests ``dec`` allocates. ``lockstep_cnt``: the engine's
        decode-set counts (members whose last block fills at each step modulo ``block_size``), which
        give the same number without reading ``dec``'s KV."""
        return self.iteration((), dec, lockstep_cnt, step)[1]

    def fits(self, grow: int) -> bool:
        """Whether ``grow`` more blocks fit in the capacity (idle cached blocks are evicted for them)."""
        return self.kv.used_blocks + grow <= self.kv.capacity_blocks

    def victims(self, chunks: list[Chunk], dec: np.ndarray, running: list[int]) -> tuple[list[int], int, int]:
        """vLLM's rule for an iteration that does not fit: preempt the newest running requests until
        it does. Returns the victims (newest first), how many of them are the last entries of
        ``dec`` (their decodes leave the batch) and the iteration's blocks without the victims'.
        Raises :class:`PlanError` when preempting every running request is not enough."""
        bs, kvt, emit = self.bs, self.kvt, self.emit
        growth: dict[int, int] = {}  # prefill chunks' blocks (as :meth:`step` counts them)
        for rid, c, last in chunks:
            k0 = int(kvt[rid])
            growth[rid] = -(-(k0 + c + (emit if last else 0)) // bs) - -(-k0 // bs)
        total = sum(growth.values()) + self.decodes(dec)
        tally = _Tally(self)
        victims: list[int] = []
        # decodes run in running order and the victims are the newest: a victim that decodes is
        # the last of ``dec`` not yet taken, and the victims' decodes end ``dec``
        n_dec_gone = 0
        n = len(running)
        while tally.used + total > self.kv.capacity_blocks:
            if len(victims) == n:
                raise PlanError("overflow: nothing left to preempt")
            victim = running[n - 1 - len(victims)]
            g = growth.pop(victim, 0)
            if n_dec_gone < len(dec) and dec[len(dec) - 1 - n_dec_gone] == victim:
                g += 1 if bs == 1 or kvt[victim] % bs == 0 else 0
                n_dec_gone += 1
            total -= g
            tally.release(victim)
            victims.append(victim)
        return victims, n_dec_gone, total

    def refusal(self, chunks: list[Chunk], dec: np.ndarray, grow: int) -> str:
        """The message of a refused iteration (``overflow="forbid"``) that needs ``grow`` blocks."""
        kv = self.kv
        short = kv.used_blocks + grow - kv.capacity_blocks
        unit = "tokens" if kv.block_size == 1 else f"blocks of {kv.block_size}"
        who = f"request {chunks[-1][0]} (prefill {chunks[-1][1]} tokens)" if chunks else f"{len(dec)} decodes"
        return (f"overflow: the plan needs {short} more {unit} than the KV capacity "
                f"({kv.capacity_blocks} {unit}, {kv.used_blocks} used); last admitted: {who}")

    # ---- a whole plan (policies, plan repair) ----------------------------------------------------
    def shortfall(self, plan: BatchPlan, running: list[int]) -> int:
        """Blocks by which ``plan`` would exceed the KV capacity (``<= 0``: it fits), counted as the
        engine counts them: the plan's preemptions free their blocks first (shared prefix blocks only
        when no one else holds them), admissions then take their cached prefix blocks (idle ones
        become used) or their swapped-out KV back, and the chunks and decodes of the iteration grow.
        ``running`` is the engine's running list. A swapped-out request that comes back evicts
        idle cached blocks to make room for its KV, as the engine does, so a later admission of the
        same plan no longer hits them."""
        bs, emit = self.bs, self.emit
        kvt, prefilled, target, gen, state = self.kvt, self.prefilled, self.target, self.gen, self.state
        swapped, kv = self.swapped, self.kv
        tally = _Tally(self)
        # 1. preemptions: the victim's state after it (kv tokens, prefilled, target, swapped)
        after: dict[int, tuple[int, int, int, bool]] = {}
        swap_s = False
        for rid in plan.preempt:
            k = int(kvt[rid])
            tally.release(rid)
            if self.preempt_mode == "swap":
                after[rid] = (k, int(prefilled[rid]), int(target[rid]), True)
                swap_s |= k > 0
            elif self.preempt_mode == "restart":
                after[rid] = (0, 0, int(self.prompt[rid]), False)
            else:
                after[rid] = (0, 0, int(self.prompt[rid] + gen[rid]), False)
        # 2. decodes of the requests running before the admissions
        dec: list[int] = []
        if plan.decode:
            gone = after.keys() | plan.pause
            dec = [r for r in running if r not in gone and prefilled[r] >= target[r]]
        # 3. admissions and chunks
        chunks: list[tuple[int, int, int, int]] = []  # (rid, chunk, kv tokens, prefill left)
        for rid, chunk in plan.prefill.items():
            if rid in after:
                k, p, t, sw = after[rid]
            elif state[rid] == WAITING:
                k, p, t, sw = int(kvt[rid]), int(prefilled[rid]), int(target[rid]), bool(swapped[rid])
            else:  # a running request continues its prefill
                chunks.append((rid, chunk, int(kvt[rid]), int(target[rid] - prefilled[rid])))
                continue
            if sw:
                blocks = -(-k // bs)
                if kv.enabled:
                    tally.make_room(blocks)
                tally.used += blocks
                swap_s |= k > 0
            elif kv.enabled:
                k = p = tally.acquire(rid) * bs
            chunks.append((rid, chunk, k, t - p))
        if swap_s:  # swapped-in requests whose prefill was complete resume decoding (the engine's rule)
            resumed = [rid for rid, _, _, left in chunks if left <= 0]
            chunks = [x for x in chunks if x[3] > 0]
            if plan.decode:
                dec = dec + resumed
        grow = 0
        for _, chunk, k, left in chunks:
            c = left if chunk == 0 or chunk > left else chunk
            grow += -(-(k + c + (emit if c == left else 0)) // bs) - -(-k // bs)
        if dec:
            if bs == 1:
                grow += len(dec)
            else:
                ks = np.array([int(kvt[r]) if r not in after else after[r][0] for r in dec], dtype=np.int64)
                grow += int(np.count_nonzero(ks % bs == 0))
        return tally.used + grow - kv.capacity_blocks

    def surely_fits(self, plan: BatchPlan, n_running: int) -> bool:
        """A cheap sufficient test that ``plan`` fits (:meth:`shortfall` ``<= 0``): every one of the
        ``n_running`` running requests and every prefill entry takes its largest possible growth."""
        bs = self.bs
        kvt, prefilled, target = self.kvt, self.prefilled, self.target
        room = self.kv.capacity_blocks - self.kv.used_blocks - n_running
        for rid in plan.prefill:
            room -= -(-(int(kvt[rid]) + int(target[rid] - prefilled[rid]) + 1) // bs) + 1
            if room < 0:
                return False
        return room >= 0


def preempt_newest(ledger: Ledger, running: list[int], n: int, rid: int, need: int, free: int,
                   preempt: list[int], reserved: dict[int, int] | None = None) -> tuple[int, int]:
    """vLLM's scheduler rule: while ``need`` blocks are missing for ``rid``, preempt the newest of
    ``running[:n]`` (``rid`` itself last), counting each victim's blocks as freed
    (:meth:`Ledger.held`) and its ``reserved`` blocks too. Returns the new ``n`` and free blocks;
    ``rid`` was preempted when it ends ``preempt``."""
    while need > free:
        n -= 1
        victim = running[n]
        preempt.append(victim)
        if victim == rid:
            break
        free += ledger.held(victim) + (reserved.pop(victim, 0) if reserved else 0)
    return n, free


class _Tally:
    """Blocks in use after hypothetical preemptions and admissions, replaying the prefix cache's
    reference counts without changing the cache."""

    __slots__ = ("led", "used", "refs", "idle", "freed", "evicted")

    def __init__(self, ledger: Ledger) -> None:
        self.led = ledger
        self.used = ledger.kv.used_blocks
        self.refs: dict[int, int] = {}  # reference counts changed so far
        self.idle = ledger.kv.idle_blocks if ledger.kv.enabled else 0  # idle cached blocks
        self.freed: list[int] = []  # blocks the preemptions made idle, in the order the cache queues them
        self.evicted: set[int] = set()  # idle blocks make_room evicted

    def _chain(self, hashes: list[int]) -> list[int]:
        """Reference counts of a chain's leading blocks, with this tally's changes."""
        refs = self.refs
        return [refs[h] if h in refs else r for h, r in zip(hashes, self.led.kv.chain_references(hashes), strict=True)]

    def release(self, rid: int) -> None:
        """``rid`` is preempted: its own blocks are freed, and its shared prefix blocks that no other
        request references any more become idle (free)."""
        led = self.led
        kv = led.kv
        shared = int(kv.shared[rid])
        self.used -= -(-int(led.kvt[rid]) // led.bs) - shared
        if shared:
            refs = self.refs
            idle = []
            hashes = kv.block_hashes(rid)[:shared]
            for h, r in zip(hashes, self._chain(hashes), strict=True):
                r -= 1
                refs[h] = r
                if r == 0:
                    idle.append(h)
            self.used -= len(idle)
            self.idle += len(idle)
            self.freed += reversed(idle)  # the cache releases a request's blocks tail first

    def acquire(self, rid: int) -> int:
        """Waiting ``rid`` is admitted: it references its cached head blocks (idle ones become
        used). Returns the number of matched blocks."""
        kv = self.led.kv
        m = kv.match_blocks(rid)
        refs = self.refs
        hashes = kv.block_hashes(rid)[:m]
        for i, (h, r) in enumerate(zip(hashes, self._chain(hashes), strict=True)):
            if h in self.evicted:  # the match ends at the first block a swap-in evicted
                return i
            if r == 0:
                self.used += 1
                self.idle -= 1
            refs[h] = r + 1
        return m

    def make_room(self, blocks: int) -> None:
        """A swapped-out request comes back with ``blocks`` blocks: idle cached blocks are
        evicted (LRU first, or by the cache's eviction priority) until they fit, as
        :meth:`KVCache.make_room` does."""
        kv = self.led.kv
        excess = self.used + self.idle + blocks - kv.capacity_blocks
        if excess > 0 and self.idle:
            # the candidates are idle in the cache or freed by this tally: their references are ours
            gone = kv.eviction_victims(excess, self.freed,
                                       lambda h: h in self.evicted or self.refs.get(h, 0) > 0)
            self.evicted.update(gone)
            self.idle -= len(gone)
