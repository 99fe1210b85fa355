"""The decision point of ``LLMSched-v1``: what the agent sees and changes at one iteration boundary.

A :class:`DecisionPoint` lives for one episode. At every boundary :meth:`DecisionPoint.begin`
computes the free KV blocks the next batch can use, orders the waiting queue, fills the ``K``
slots and evaluates the admission rule on them. While the agent forms the batch (``select``
mode: one request or one preemption per step) it keeps the batch being formed: the chosen
requests (``sel``), the running requests chosen for preemption (``victims``) and the blocks
they reserve or release, so that the masks stay exact without touching the engine.

Memory is counted in whole blocks by the engine's :class:`~llmsched_gym.core.ledger.Ledger`:
``free`` is the capacity minus the blocks in use, minus this iteration's decode growth, minus the
blocks still owed to unfinished (chunked) prefills (:meth:`~llmsched_gym.core.ledger.Ledger.growth`
of each running request), minus what the batch being formed has reserved (each admission its
whole prompt, :meth:`~llmsched_gym.core.ledger.Ledger.whole_prompt`), plus what its preemptions
release (:meth:`~llmsched_gym.core.ledger.Ledger.own` and the victim's growth).
"""

from __future__ import annotations

import bisect
from itertools import islice
from typing import TYPE_CHECKING

import numpy as np

from llmsched_gym.env import observation as obs_mod
from llmsched_gym.env.admission import FutureProfile

if TYPE_CHECKING:
    from llmsched_gym.core.engine import Engine

ORDERS = ("arrival", "shortest", "prompt", "deadline")
_EDGES = list(obs_mod.REMAINING_BIN_EDGES)
N_BINS = len(_EDGES) + 1
_BIN_LOW = np.array([1, *_EDGES, 1 << 62], np.int64)
"""Each bin's lowest remaining output, and a bound above all (remaining outputs are at least 1)."""
_NO_HIST = np.zeros(N_BINS, np.int64)
_NO_HIST.flags.writeable = False


class DecisionPoint:
    """Slots, masks and the batch being formed (see the module docstring).

    :param k: number of slots.
    :param order: canonical slot order (``ORDERS``).
    :param admission: admission rule (``current``, ``future`` or ``none``).
    :param max_num_seqs: cap on running + chosen requests (``None``: no cap).
    """

    def __init__(self, k: int, order: str, admission: str, max_num_seqs: int | None) -> None:
        self.K = k
        self.order = order
        self.admission = admission
        self.max_num_seqs = max_num_seqs
        self._false = np.zeros(k, bool)
        self._ones = np.ones(k, bool)
        self.version = 0  # counts the changes of the slots and the batch being formed (masks cache)

    # ------------------------------------------------------------------------------------------
    # episode
    def setup(self, e: Engine) -> None:
        """Per-request tables of a new episode (``e`` is the episode's engine)."""
        wl, kv = e.workload, e.kv
        self.e = e
        self.led = led = e.ledger
        self.bs = kv.block_size
        self.pad = kv.block_size - 1
        self.emit = 1 if e.config.prefill_emits_token else 0
        self.cap_tokens = kv.capacity_tokens
        self.cap_blocks = kv.capacity_blocks
        self.target, self.gen, self.kvt, self.prefilled = e.prefill_target, e.generated, e.kv_tokens, e.prefilled
        self.pred = wl.predicted_output
        n = len(wl)
        self.fp_run = FutureProfile(self.cap_tokens, n)
        self.fp = FutureProfile(self.cap_tokens, n)
        has_ttft = np.isfinite(wl.ttft_slo_s)
        self.deadline_key = np.where(has_ttft, wl.arrival_s + np.where(has_ttft, wl.ttft_slo_s, 0.0), np.inf)
        # per request, constant until it is preempted (refresh): KV blocks its admission needs,
        # its Eq. (1) line as a candidate (completion point c, base b)
        target = wl.prompt_tokens
        self.need = led.whole_prompt(target)
        self.cand_c = np.maximum(self.pred, 1) + (1 - self.emit)
        self.cand_b = target + (self.emit - 1 + self.pad)
        self.spare = self.cap_tokens - self.cand_b  # (the Eq. (1) room's M - base)
        self.room = np.zeros(n, np.int64)
        self.empty_pad = np.full(self.K, n, np.int64)
        self.bid = 0
        self.slots: list[int] = []
        self.ok = np.zeros(0, bool)
        self.all_ok = True  # every slot shown is admissible (the masks only depend on how many)
        self.any = False
        self.sel: list[int] = []
        self.victims: list[int] = []
        self.sel_tokens = 0
        self.running_ok = False
        self.unfinished: tuple[list[int], list[int]] | None = None

    def refresh(self, rid: int) -> None:
        """A preempted request's prefill target, remaining output or swap state changed."""
        e = self.e
        target = int(self.target[rid])
        rem = max(int(self.pred[rid] - self.gen[rid]), 1)
        if e.swapped[rid]:  # its KV back, then a decode (or the rest of its prefill)
            self.need[rid] = self.led.blocks(int(self.kvt[rid]) + 1)
        else:
            self.need[rid] = self.led.whole_prompt(target)
        self.cand_c[rid] = rem + 1 - self.emit
        self.cand_b[rid] = target + self.emit - 1 + self.pad
        self.spare[rid] = self.cap_tokens - self.cand_b[rid]

    # ------------------------------------------------------------------------------------------
    # boundary
    def begin(self) -> None:
        """A new boundary: free blocks, queue order, slots and admissibility."""
        e = self.e
        self.bid += 1
        self.version += 1
        self.sel = []
        self.sel_blocks = 0
        self.sel_tokens = 0
        self.sel_hist = _NO_HIST  # a fresh array at the first choice (most boundaries choose none)
        self.sel_c: list[int] = []
        self.sel_b: list[int] = []
        self.sel_peaks = 0
        self.victims = []
        self.released = 0
        self.running_ok = False
        self.residents_ok = False
        self.profile_ok = False
        self.row_upto = self.room_upto = 0
        self.win_len = -1
        running = e.running
        growth = 0
        if running:
            if self.bs == 1 and not e.n_in_prefill:
                growth = len(running)
            else:
                growth = self.running_set()
        self.free = self.cap_blocks - e.kv.used_blocks - growth
        w = e.waiting
        self.n_waiting = len(w)
        if not w:
            self.queue = self.slots = []
            self.qpos = 0
            self.ids_pad = self.empty_pad
            self.ids = self.ids_pad[:0]
            self.fits_now = self.fits_future = self.ok = self._false[:0]
            self.all_ok = True  # (no slot)
            self.any = False
            return
        # the window the caches start with (see window()): the slots are its head
        self.win_len = m = 2 * self.K
        if self.order == "arrival" or len(w) <= 1:
            self.queue = w
            self.win = np.fromiter(islice(w, m), np.int64, min(m, self.n_waiting))
        else:
            ids = np.fromiter(w, np.int64, self.n_waiting)  # (np.array(w) takes 6x longer on the queue object)
            if self.order == "shortest":
                key = self.cand_c[ids]
            elif self.order == "prompt":
                key = self.target[ids]
            else:
                key = self.deadline_key[ids]
            ids = ids[key.argsort(kind="stable")]
            self.queue = ids  # (an array: read past the window only by a long run of selections)
            self.win = ids[:m]
        head = self.win[: self.K]
        slots = head.tolist()
        self.qpos = len(slots)
        self.fill_slots(slots, head)

    def running_set(self) -> int:
        """Arrays of the surviving running requests, computed once per boundary (a preemption
        removes its victim in place, :meth:`drop_running`): each one's Eq. (1) line (remaining
        output ``rem``, base ``line_base``, see :meth:`residents`), the prompt tokens it still owes
        and the batch shape (:meth:`batch_shape`). Returns the blocks they add next iteration."""
        e, emit, pad = self.e, self.emit, self.pad
        self.running_ok = True
        self.residents_ok = False
        run = self.survivors()
        self.run_list = run
        ids = np.fromiter(run, np.int64, len(run))
        kvt = self.kvt[ids]
        rem = self.pred[ids]
        rem -= self.gen[ids]
        np.maximum(rem, 1, out=rem)
        n = len(run)
        if e.n_in_prefill:
            pf = self.prefilled[ids]
            # the unfinished prefills: few (chunked prefills run one or two at a time), so their
            # sums and blocks are Python integers over their positions
            mid = pf < self.target[ids]
            at = mid.nonzero()[0].tolist()
            n_mid = len(at)
            kv_l = kvt.tolist()
            mid_kv = [kv_l[j] for j in at]
            pf_l = [int(pf[j]) for j in at]
            owed_l = [int(self.target[run[j]]) - p for j, p in zip(at, pf_l, strict=True)]
            # an unfinished prefill is a line like a candidate's (cand_c, cand_b): base KV +
            # owed + emitted - 1; a decode's is its KV (owed 0), so one formula when prefill
            # emits a token
            base = kvt + pad
            for j, owed in zip(at, owed_l, strict=True):
                base[j] += owed
            if not emit:
                base -= mid
                rem += mid
            owed = sum(owed_l)
            self.shape = (n - n_mid, sum(kv_l) - sum(mid_kv), n_mid, owed, sum(pf_l))
            self.unfinished = ([run[j] for j in at], owed_l)
            growth = self.led.running_growth(kvt, mids=list(zip(mid_kv, owed_l, strict=True)))
        else:
            base = kvt + pad if pad else kvt
            self.shape = (n, sum(kvt.tolist()), 0, 0, 0)
            self.unfinished = ([], [])
            growth = self.led.running_growth(kvt, None)
        self.n_run = n
        self.rem, self.line_base = rem, base
        return growth

    def drop_running(self, rid: int) -> None:
        """Take running request ``rid`` (chosen for preemption) out of :meth:`running_set`'s arrays."""
        i = self.run_list.index(rid)
        self.run_list = self.run_list[:i] + self.run_list[i + 1:]
        self.rem = np.concatenate((self.rem[:i], self.rem[i + 1:]))
        self.line_base = np.concatenate((self.line_base[:i], self.line_base[i + 1:]))
        n_dec, dec_ctx, n_mid, owed, mid_ctx = self.shape
        left = int(self.target[rid] - self.prefilled[rid])
        if left > 0:
            self.shape = (n_dec, dec_ctx, n_mid - 1, owed - left, mid_ctx - int(self.prefilled[rid]))
            ids, owes = self.unfinished
            j = ids.index(rid)
            self.unfinished = (ids[:j] + ids[j + 1:], owes[:j] + owes[j + 1:])
        else:
            self.shape = (n_dec - 1, dec_ctx - int(self.kvt[rid]), n_mid, owed, mid_ctx)
        self.n_run -= 1
        self.residents_ok = False

    def unfinished_prefills(self) -> tuple[list[int], list[int]]:
        """The surviving running requests with an unfinished prefill, in admission order, and the
        prompt tokens each still owes (computed with the running set; read only)."""
        if not self.running_ok:
            self.running_set()
        return self.unfinished

    def batch_shape(self) -> tuple[int, int, int, int, int]:
        """Decodes and their KV tokens (context), unfinished prefills, the prompt tokens they still
        owe and their context, of the surviving running requests."""
        if not self.running_ok:
            self.running_set()
        return self.shape

    def growth(self, rid: int) -> int:
        """Blocks running request ``rid`` adds in the next iteration if it runs: a decode's new
        block, or everything its unfinished prefill still owes (reserved)."""
        return self.led.growth(rid)

    def survivors(self) -> list[int]:
        """Running requests not chosen for preemption."""
        run = self.e.running
        if not self.victims:
            return run
        gone = set(self.victims)
        return [r for r in run if r not in gone]

    def fill_slots(self, slots: list[int], ids: np.ndarray | None = None) -> None:
        """Show ``slots`` (queue entries not chosen yet; ``ids``: the same as an array, if the
        caller has it) and evaluate the admission rule on them."""
        k = self.K
        self.version += 1
        self.slots = slots
        n = len(slots)
        # padded with the all-zero feature row, so one gather builds the queue observation
        if n == k:
            self.ids_pad = self.ids = ids = np.array(slots, np.int64) if ids is None else ids
        else:
            self.ids_pad = pad = self.empty_pad.copy()
            pad[:n] = slots if ids is None else ids
            ids = self.ids = pad[:n]
        self.fits_now = fits = self.need[ids] <= self.free - self.sel_blocks
        self.fits_future = None
        if self.admission == "current":
            ok = fits
        elif self.admission == "none":
            ok = self._ones if n == k else self._ones[:n]
        else:
            ok = self.fits_future = self.future_fits(ids)
        m = self.max_num_seqs
        capped = m is not None and len(self.e.running) - len(self.victims) + len(self.sel) >= m
        if capped:
            ok = self._false[:n]
        self.ok = ok
        self.all_ok = self.admission == "none" and not capped
        self.any = n > 0 and ((self.admission == "none" and m is None) or bool(ok.any()))

    # ------------------------------------------------------------------------------------------
    # forming the batch
    def select(self, slot: int) -> None:
        """Add the request in ``slot`` to the batch; the slots shift up and the next queue entry
        enters at the end."""
        slots = self.slots
        rid = slots[slot]
        self.sel.append(rid)
        self.take(rid)
        slots = slots.copy()
        del slots[slot]
        q = self.qpos
        if q < self.n_waiting:
            # from this boundary's window when it reaches that far (indexing the engine's queue
            # past its head builds a list of the whole queue)
            slots.append(int(self.win[q] if q < self.win_len else self.queue[q]))
            self.qpos = q + 1
        self.fill_slots(slots)

    def take(self, rid: int) -> None:
        """Reserve ``rid``'s KV and add its Eq. (1) line to the batch being formed."""
        c, b = int(self.cand_c[rid]), int(self.cand_b[rid])
        self.sel_blocks += int(self.need[rid])
        self.sel_tokens += int(self.target[rid] - self.prefilled[rid])
        if not self.sel_c:
            self.sel_hist = np.zeros(N_BINS, np.int64)
        self.sel_c.append(c)
        self.sel_b.append(b)
        self.sel_peaks += c + b
        self.sel_hist[bisect.bisect_right(_EDGES, c - 1 + self.emit)] += 1
        self.profile_ok = False

    def victim(self, rule: str) -> int | None:
        """The running request a preemption by ``rule`` would evict now (None if none is left)."""
        run = self.survivors()
        if not run:
            return None
        if rule == "newest":
            return run[-1]
        rem = np.maximum(self.pred[run] - self.gen[run], 1)
        # longest predicted remaining output; ties: the newest id (SRPT's order)
        return int(max(zip(rem.tolist(), run, strict=True))[1])

    def preempt(self, rid: int) -> None:
        """Choose running request ``rid`` for preemption: its blocks and its growth are released."""
        self.victims.append(rid)
        held = self.led.own(rid)  # shared prefix blocks stay
        self.free += held + self.led.growth(rid)
        self.released += held
        if self.running_ok:
            self.drop_running(rid)
        self.profile_ok = False
        self.room_upto = 0
        self.fill_slots(self.slots)

    def admissible(self, rid: int) -> bool:
        rule = self.admission
        m = self.max_num_seqs
        if m is not None and len(self.e.running) - len(self.victims) + len(self.sel) >= m:
            return False
        if rule == "current":
            return int(self.need[rid]) <= self.free - self.sel_blocks
        if rule == "future":
            return bool(self.future_fits(np.array([rid]))[0])
        return True

    def filter(self, slots: list[int], stop_at_first: bool) -> list[int]:
        """Admit ``slots`` in the given order while the admission rule allows (skipping or stopping).

        Every caller launches the batch right after, so without a rule to check (admission
        ``none``, no ``max_num_seqs``) the chosen requests are only recorded: the KV they
        reserve and their Eq. (1) lines (:meth:`take`) would only serve the masks and the
        observation of the batch being formed, which the launch replaces."""
        if self.admission == "none" and self.max_num_seqs is None:
            slots_now = self.slots
            admitted = [slots_now[s] for s in slots]
            self.sel.extend(admitted)
            self.version += 1
            return admitted
        admitted: list[int] = []
        for s in slots:
            rid = self.slots[s]
            if self.admissible(rid):
                admitted.append(rid)
                self.sel.append(rid)
                self.take(rid)
            elif stop_at_first:
                break
        return admitted

    # ------------------------------------------------------------------------------------------
    # the running requests and the future rule
    def residents(self) -> None:
        """The running requests' remaining-output histogram and their Eq. (1) profile (lines
        sorted by completion point). An unfinished prefill counts at its full prompt; requests
        chosen for preemption are left out."""
        if self.residents_ok:
            return
        if not self.running_ok:
            self.running_set()
        self.residents_ok = True
        rem = self.rem
        # sort the lines by completion point (the order among equal points does not matter: the
        # profile's values at a group of equal points are its first one's, see FutureProfile.build)
        order = rem.argsort(kind="stable")
        self.line_c = c = rem[order]
        self.line_b = self.line_base[order]
        self.fp_run.build(c, self.line_b)
        # the histogram from the sorted points: bin i holds the points in [_BIN_LOW[i], _BIN_LOW[i + 1])
        cut = c.searchsorted(_BIN_LOW)
        self.run_hist = cut[1:] - cut[:-1]

    def window(self, covered: int) -> tuple[np.ndarray | None, int]:
        """Queue entries the slots may show before the caches filled up to ``covered`` run out
        (``None`` while they last); caches are filled K entries ahead, so that a run of selections
        (each shifts the slots by one) needs no refill. The queue does not change within a
        boundary, so both caches (queue rows, rooms) share one array of the entries."""
        need = self.K + len(self.sel)
        if need <= covered:
            return None, covered
        m = need + self.K
        if m != self.win_len:
            self.win_len = m
            self.win = np.array(self.queue[:m], np.int64)
        return self.win, m

    def rooms(self, ids: np.ndarray) -> np.ndarray:
        """Eq. (1) room of requests ``ids`` against the running requests (cached per boundary)."""
        if self.room_upto < self.K + len(self.sel):  # (window()'s test, without the call)
            new, self.room_upto = self.window(self.room_upto)
            self.residents()
            self.room[new] = self.fp_run.room_left(self.cand_c[new], self.spare[new])
        return self.room[ids]

    def future_fits(self, ids: np.ndarray) -> np.ndarray:
        """The ``future`` rule for requests ``ids`` given the running requests and the batch so far.

        No room against the running requests alone is final (chosen requests only add memory);
        room for every chosen request's peak ``base + c`` held throughout is sufficient. The exact
        profile with the chosen requests' lines is built only when some request falls between."""
        room = self.rooms(ids)
        sure = room >= self.sel_peaks
        if not self.sel_c:
            return sure
        unsure = (room >= 0) > sure
        if not unsure.any():
            return sure
        if not self.profile_ok:
            lc = np.concatenate((self.line_c, self.sel_c))
            lb = np.concatenate((self.line_b, self.sel_b))
            order = lc.argsort(kind="stable")
            self.fp.build(lc[order], lb[order])
            self.profile_ok = True
        cand = ids[unsure]
        sure[unsure] = self.fp.fits(self.cand_c[cand], self.cand_b[cand])
        return sure
