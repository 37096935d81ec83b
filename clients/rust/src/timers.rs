//! The instants the client's one timer task acts at (requests' deadlines, locks' lost times),
//! kept so that the common case costs next to nothing: deadlines mostly come in order (the same
//! request timeout, the same lease), and mostly go away before they pass, in about the order they
//! came.

use std::collections::{BTreeSet, VecDeque};

/// Instants `T` with keys (request ids on tokio's clock, lock tokens on the lease clock),
/// earliest first. One added no earlier than the last goes to the back of a queue; any other to
/// an ordered set. The owner keeps the live entries (its table says which are); taking one out of
/// the queue is lazy: a dead entry leaves when it reaches the front, or when the queue is
/// compacted.
pub(crate) struct Deadlines<T> {
    queue: VecDeque<(T, u64)>,
    late: BTreeSet<(T, u64)>,
}

impl<T> Default for Deadlines<T> {
    fn default() -> Self {
        Deadlines { queue: VecDeque::new(), late: BTreeSet::new() }
    }
}

impl<T: Copy + Ord> Deadlines<T> {
    /// Adds `key` at `at`; returns whether it went to the ordered set, to pass to
    /// [`remove`](Deadlines::remove). Past `in_order_until` it goes there too: an entry much later
    /// than the usual would hold every usual one after it out of the queue. `live_count` (how
    /// many entries the owner holds) and `live` bound the queue's dead entries: past twice the
    /// live ones (and a margin) the queue is compacted, so each add pays for one check.
    #[inline]
    pub fn insert(
        &mut self,
        at: T,
        key: u64,
        in_order_until: Option<T>,
        live_count: usize,
        live: impl Fn(T, u64) -> bool,
    ) -> bool {
        let late = self.queue.back().is_some_and(|&(last, _)| at < last) || in_order_until.is_some_and(|u| at > u);
        if late {
            self.late.insert((at, key));
        } else {
            if self.queue.len() > 2 * live_count + 1024 {
                self.queue.retain(|&(at, key)| live(at, key));
            }
            self.queue.push_back((at, key));
        }
        late
    }

    /// Takes out the entry `key` at `at` (added with the `late` that [`insert`](Deadlines::insert)
    /// returned), which the owner no longer holds; `live` says which entries it still holds. At
    /// the front of the queue (the usual case) it leaves at once; elsewhere it stays, dead, and
    /// the dead entries at the front leave instead (one look at the owner's table when none).
    #[inline]
    pub fn remove(&mut self, at: T, key: u64, late: bool, live: impl Fn(T, u64) -> bool) {
        if late {
            self.late.remove(&(at, key));
        } else if self.queue.front() == Some(&(at, key)) {
            self.queue.pop_front();
        } else {
            self.drop_dead(live);
        }
    }

    /// Drops the dead entries at the front of the queue.
    pub fn drop_dead(&mut self, live: impl Fn(T, u64) -> bool) {
        while let Some(&(at, key)) = self.queue.front() {
            if live(at, key) {
                break;
            }
            self.queue.pop_front();
        }
    }

    /// The earliest entry, if it is due by `now` (dead or not: the caller checks).
    pub fn pop_due(&mut self, now: T) -> Option<(T, u64)> {
        let q = self.queue.front().copied().filter(|&(at, _)| at <= now);
        let l = self.late.first().copied().filter(|&(at, _)| at <= now);
        match (q, l) {
            (Some(a), Some(b)) if b < a => self.late.pop_first(),
            (Some(_), _) => self.queue.pop_front(),
            (None, Some(_)) => self.late.pop_first(),
            (None, None) => None,
        }
    }

    /// The earliest instant (of an entry that may be dead).
    pub fn first(&self) -> Option<T> {
        let q = self.queue.front().map(|&(at, _)| at);
        let l = self.late.first().map(|&(at, _)| at);
        match (q, l) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn clear(&mut self) {
        self.queue.clear();
        self.late.clear();
    }
}
