"""Inner updates in proportion to measured speed (``--mode async``): the Asynchronous Local-SGD paper's
*dynamic local updates* (2401.09135), granted from one budget that every worker shares.

A run of N workers for T updates each (``--max-steps``, or ``--epochs``' worth) trains on the samples of
N*T updates in every mode; that is the async run's *budget*. With every answer the server grants the
worker the number of inner updates to run before its next push and counts them against the budget, so
the run ends when the budget is spent (each of its samples trained on once), not when the slowest worker
has done its T:

- S = 0 (synchronous DiLoCo, not proportional): K each, out of the worker's own T, so every worker runs
  what ``--mode param`` runs (K a round; what is left of T, if less, in the last).
- S >= 1 (proportional): ``K_i = K * rate_i / mean rate`` (at least 1). ``rate_i`` is the updates of
  worker i's last grant over the seconds from the answer that granted them to the push that brought them
  (its compute and its link both: what decides when it is back); until every rate is known, K. The K_i
  add up to N*K, so the workers come back at about the same moment, a round as long as the others'.
- Workers answered together (a round's pushes averaged in one outer step, a release) are granted together
  (``share_out``): K per worker in all, split by rate, so rounds stay whole down to the budget's end.
- A worker answered alone is, near the end, also capped at its *share* of the work left (the updates not
  granted yet, plus those the other active workers are expected still to run of theirs), split in
  proportion to the rates: every worker is expected to finish at the same moment, instead of the fast one
  idling while the slow one runs a whole grant.
- A remainder under K/CRUMB goes with the grant before it rather than making a round of its own.

When a worker pushes, the part of its grant it did not run (a worker that stopped early) goes back to the
budget, so the updates granted and run always add up: at a consistent point (every worker parked), before the
release grants anything more, each worker's ``given`` is what it has run, the checkpoint's record of the budget.

With --outer-delay D a worker does not wait for a push's answer: it trains on until the answer is there, up
to D updates. Those are set aside by the answer before (``reserve``: ``ahead``), so the budget never pays for
updates nobody granted; once the push is delivered they are the worker's ``window``, and the push after it
brings them: a worker's grant counts from its push, and where it ran more updates ahead than it was then
granted, it pushes as soon as it has the answer, the extra coming out of its window (``deliver``). A grant is
thus its share of the round whatever the worker ran ahead, and D may be as large as a round. The rate is then
measured from push to push (``since`` is the previous push's arrival, not the answer's), less the time the
worker waited for that answer (the push brings it: a fast worker that waited for a slow one is not slow).

The same measurements tell the server when a worker is due back (``back_within``: the server lets a push
wait for workers about to come back, so that their pushes are averaged rather than applied one by one,
each stale) and which worker is the fastest (``fastest``: the one asked to validate). The rates go with a
checkpoint, so a resumed run grants by them from its first round, until it has measured them again.
"""
from __future__ import annotations

from dataclasses import dataclass, field

CRUMB = 8       # a remainder of the budget under K / CRUMB is granted with the grant before it


@dataclass
class Grants:
    """The budget ledger of ``workers`` workers: ``budget`` updates in all, ``every`` (K) the mean grant;
    ``proportional`` False: K each out of each worker's equal share (S = 0). Per worker: ``given``, the
    updates it has run or is running (a checkpoint's record of the budget spent), ``current``, its running
    grant, ``ahead``, the updates set aside for it to run after its next push before that push's answer, and
    ``window``, those of its last push not yet covered by a grant (--outer-delay), ``rates``
    (updates a second, None until measured) and ``since``, when it started its running grant (on the
    server's clock)."""
    budget: int
    every: int
    workers: int
    proportional: bool
    given: list[int] = field(init=False)
    current: list[int] = field(init=False)
    ahead: list[int] = field(init=False)
    window: list[int] = field(init=False)
    rates: list[float | None] = field(init=False)
    since: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.given, self.current = [0] * self.workers, [0] * self.workers
        self.ahead, self.window = [0] * self.workers, [0] * self.workers
        self.rates, self.since = [None] * self.workers, [0.0] * self.workers

    @property
    def left(self) -> int:
        """Updates of the budget neither granted nor set aside yet."""
        return self.budget - sum(self.given) - sum(self.ahead) - sum(self.window)

    def reserve(self, rank: int, ahead: int) -> int:
        """Set aside up to ``ahead`` updates for worker ``rank`` to run after its next push, before it takes
        that push's answer; returns how many (fewer near the budget's end; at S = 0, near the end of the
        worker's own share: out of the others' shares, it ran past its T, and was then granted less than
        nothing, which it pushed after every update, never to stop)."""
        own = self.budget // self.workers - self.given[rank] - self.window[rank]
        left = self.left if self.proportional else min(self.left, own)
        self.ahead[rank] = max(0, min(ahead, left))
        return self.ahead[rank]

    def measure(self, rank: int, updates: int, arrived: float, waited: float = 0.0) -> None:
        """Worker ``rank``'s push of ``updates`` updates arrived at ``arrived``: its rate, not counting the
        ``waited`` seconds it stood still since ``since`` (for a push's answer it took late, --outer-delay)."""
        seconds = arrived - self.since[rank] - waited
        if updates and seconds > 0:
            self.rates[rank] = updates / seconds

    def deliver(self, rank: int, updates: int, ahead: bool = False) -> None:
        """Worker ``rank``'s push of ``updates`` updates is applied: whatever of its grant it did not run goes
        back to the budget, what it ran beyond it (ahead of the last answer) comes out of its window; if this
        push runs ahead (``ahead``), the updates set aside for that are its window now."""
        self.given[rank] += updates - self.current[rank]
        self.current[rank] = 0
        self.window[rank], self.ahead[rank] = (self.ahead[rank] if ahead else 0), 0

    def lose(self, rank: int) -> int:
        """Worker ``rank`` died: what it was granted and had not delivered (its running grant, the updates set aside
        for it to run ahead, its window) goes back to the budget, for its replacement or the others; returns how many."""
        returned = self.current[rank] + self.ahead[rank] + self.window[rank]
        self.given[rank] -= self.current[rank]
        self.current[rank] = self.ahead[rank] = self.window[rank] = 0
        return returned

    def grant(self, rank: int, now: float, active: set[int]) -> int:
        """The updates worker ``rank``, answered alone, is to run from ``now`` before its next push (0: none
        left); ``active``: the workers that will still take grants (not parked), for its share of the rest."""
        if self.proportional:
            available = self._available([rank])
            granted = self._absorb(min(self._proportional(rank, now, active), available), available)
        else:
            granted = self._own(rank)
        self._give(rank, granted, now)
        return granted

    def settle(self, rank: int, now: float) -> int:
        """Worker ``rank`` granted exactly its window (a run that ends or parks while it runs ahead of its push's
        answer: it pushes again, parked, once it has run them, or at once where it ran that many)."""
        granted, self.window[rank] = self.window[rank], 0
        self._give(rank, granted, now)
        return granted

    def share_out(self, ranks: list[int], now: float) -> list[int]:
        """The grants of ``ranks``, answered at the same moment and the only workers to take any (a round's
        pushes averaged together, a release): K x rate / mean rate each (K each until all are measured),
        adding up to exactly K per worker or what is left, at least 1 each where that many are left. Rounds
        are then whole down to the budget's end, rather than leaving a few updates for a round of their own
        (an outer step, whose momentum moves the anchor as far as a whole round's: 2.71 to 2.82 on the bench)."""
        if self.proportional:
            available = self._available(ranks)
            total = self._absorb(min(self.every * len(ranks), available), available)
            measured = all(self.rates[r] is not None for r in ranks)
            grants = covering(apportion(total, [self.rates[r] if measured else 1.0 for r in ranks]),
                              [self.window[r] for r in ranks])
        else:
            grants = [self._own(r) for r in ranks]
        for rank, granted in zip(ranks, grants):
            self._give(rank, granted, now)
        return grants

    def _own(self, rank: int) -> int:
        """S = 0: K out of the worker's own equal share of the budget (its window, run ahead, is part of it)."""
        return max(0, min(self.every, self.budget // self.workers - self.given[rank]))

    def _available(self, ranks: list[int]) -> int:
        """What grants to ``ranks`` may take: the budget left, and their windows, which a grant covers (``_give``)."""
        return self.left + sum(self.window[r] for r in ranks)

    def _absorb(self, granted: int, available: int) -> int:
        """``granted``, or all that is ``available`` where that would leave a remainder under K / CRUMB."""
        return available if available - granted < self.every / CRUMB else granted

    def _give(self, rank: int, granted: int, now: float) -> None:
        """A grant counts from the worker's push, so the updates it ran ahead of the answer (its window) are
        part of it: the window keeps only what the grant does not cover. (Counted in both, they held the
        budget twice near its end, and the last round came in two halves, each with its exchange exposed.)"""
        self.given[rank] += granted
        self.window[rank] = max(0, self.window[rank] - granted)
        self.current[rank], self.since[rank] = granted, now

    def _proportional(self, rank: int, now: float, active: set[int]) -> int:
        """K * rate / mean rate, capped at the worker's share of the work left (K until every rate is known)."""
        rates = [self.rates[r] for r in sorted(active | {rank})]
        if any(rate is None for rate in rates):
            return self.every
        mine = self.rates[rank]
        want = self.every * mine * len(rates) / sum(rates)
        running = sum(max(0.0, self.current[r] - self.rates[r] * (now - self.since[r])) for r in active - {rank})
        share = mine * (self._available([rank]) + running) / sum(rates)
        return max(1, round(min(want, share)))

    def fastest(self, otherwise: int) -> int:
        """The worker with the highest measured rate (``otherwise`` while none is measured)."""
        measured = [r for r, rate in enumerate(self.rates) if rate is not None]
        return max(measured, key=lambda r: self.rates[r]) if measured else otherwise

    def back_within(self, ranks: list[int], now: float, fraction: float) -> bool:
        """Whether each of ``ranks`` is expected to push within ``fraction`` of a round (K at the mean rate) from
        ``now``: its grant at its measured rate; one not measured yet is in its first grant, which is K for
        every worker, so its first round is waited for (synchronous, as DiLoCo's)."""
        if any(not self.current[r] for r in ranks):
            return False
        if any(self.rates[r] is None for r in ranks):
            return True
        measured = [rate for rate in self.rates if rate is not None]
        limit = fraction * self.every * len(measured) / sum(measured)
        return all(self.since[r] + self.current[r] / self.rates[r] - now <= limit for r in ranks)


def covering(grants: list[int], windows: list[int]) -> list[int]:
    """``grants`` (whose sum is at least that of ``windows``), each raised to at least its worker's window, the
    updates it runs ahead of its answer anyway, out of the largest grants beyond their windows. A pooled grant below
    a window left part of that window held while the others' grants spent it: the budget went below nothing, was
    never spent, and the run never ended."""
    grants = list(grants)
    for i, window in enumerate(windows):
        while grants[i] < window:
            # the grant furthest above its window, keeping one update where it can (a grant of 0 ends a worker)
            j = max(range(len(grants)), key=lambda k: (grants[k] - max(windows[k], 1), grants[k] - windows[k]))
            grants[j] -= 1
            grants[i] += 1
    return grants


def apportion(total: int, weights: list[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainders), at least 1 each where it allows."""
    quotas = [total * weight / sum(weights) for weight in weights]
    shares = [int(quota) for quota in quotas]
    for i in sorted(range(len(shares)), key=lambda i: shares[i] - quotas[i])[:total - sum(shares)]:
        shares[i] += 1
    for i in range(len(shares) if total >= len(shares) else 0):
        if not shares[i]:
            shares[max(range(len(shares)), key=shares.__getitem__)] -= 1
            shares[i] = 1
    return shares
