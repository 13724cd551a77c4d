//! A work queue shared fairly between namespaces: each namespace waits in its own line, bounded
//! on its own and all together; lines are served in turn; and a namespace has at most a given
//! number of items in hand at once. So one tenant's flood of failing pods, or of evictions its
//! PodDisruptionBudgets refuse, delays no other tenant's.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::Notify;

pub(super) struct FairQueue<T> {
    state: Mutex<State<T>>,
    changed: Notify,
    per_namespace: usize,
    total: usize,
}

struct State<T> {
    lines: BTreeMap<String, VecDeque<T>>,
    /// Namespaces with items waiting, in the order they are served.
    turn: VecDeque<String>,
    /// Items each namespace has in hand (taken, not yet done).
    busy: BTreeMap<String, usize>,
    len: usize,
}

impl<T> FairQueue<T> {
    pub(super) fn new(per_namespace: usize, total: usize) -> Self {
        let state = State { lines: BTreeMap::new(), turn: VecDeque::new(), busy: BTreeMap::new(), len: 0 };
        FairQueue { state: Mutex::new(state), changed: Notify::new(), per_namespace: per_namespace.max(1), total: total.max(1) }
    }

    fn with<R>(&self, f: impl FnOnce(&mut State<T>) -> R) -> R {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Queue `item` in `namespace`'s line; false (and dropped) when that line or the queue is full.
    pub(super) fn push(&self, namespace: &str, item: T) -> bool {
        let pushed = self.with(|s| {
            let line = s.lines.entry(namespace.to_string()).or_default();
            if line.len() >= self.per_namespace || s.len >= self.total {
                if line.is_empty() {
                    s.lines.remove(namespace);
                }
                return false;
            }
            if line.is_empty() {
                s.turn.push_back(namespace.to_string());
            }
            line.push_back(item);
            s.len += 1;
            true
        });
        if pushed {
            self.changed.notify_waiters();
        }
        pushed
    }

    /// The next item of the first namespace in turn with fewer than `slots` in hand; that
    /// namespace goes to the end of the turn.
    fn try_take(&self, slots: usize) -> Option<(String, T)> {
        self.with(|s| {
            let at = s.turn.iter().position(|ns| s.busy.get(ns).copied().unwrap_or(0) < slots)?;
            let namespace = s.turn.remove(at)?;
            let line = s.lines.get_mut(&namespace)?;
            let item = line.pop_front()?;
            if line.is_empty() {
                s.lines.remove(&namespace);
            } else {
                s.turn.push_back(namespace.clone());
            }
            s.len -= 1;
            *s.busy.entry(namespace.clone()).or_default() += 1;
            Some((namespace, item))
        })
    }

    /// Wait for the next item (see [`FairQueue::try_take`]); hand it back with [`FairQueue::done`].
    pub(super) async fn take(&self, slots: usize) -> (String, T) {
        loop {
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            if let Some(taken) = self.try_take(slots) {
                return taken;
            }
            changed.await;
        }
    }

    /// An item of `namespace` taken earlier is finished: its slot is free.
    pub(super) fn done(&self, namespace: &str) {
        self.with(|s| {
            if let Some(n) = s.busy.get_mut(namespace) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    s.busy.remove(namespace);
                }
            }
        });
        self.changed.notify_waiters();
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.with(|s| s.len)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::FairQueue;

    #[tokio::test]
    async fn a_flooding_namespace_holds_neither_the_queue_nor_the_slots() {
        let q = FairQueue::new(64, 1024);
        let pushed = (0..2000).filter(|i| q.push("evil", *i)).count();
        assert_eq!(pushed, 64, "a namespace's line is bounded on its own");
        assert!(q.push("victim", 1), "and leaves room for the others");
        // The flood's first items are in hand and never finish (an eviction held by a
        // PodDisruptionBudget, a stalled registry).
        let (a, _) = q.take(2).await;
        let (b, _) = q.take(2).await;
        assert_eq!((a.as_str(), b.as_str()), ("evil", "victim"), "lines are served in turn");
        let (c, _) = q.take(2).await;
        assert_eq!(c, "evil");
        // evil has its two slots in hand: nothing of it is taken until one is done.
        assert!(tokio::time::timeout(Duration::from_millis(50), q.take(2)).await.is_err());
        assert!(q.push("late", 7));
        let (ns, item) = tokio::time::timeout(Duration::from_millis(50), q.take(2)).await.expect("another namespace is served at once");
        assert_eq!((ns.as_str(), item), ("late", 7));
        q.done("evil");
        let (ns, _) = tokio::time::timeout(Duration::from_millis(50), q.take(2)).await.expect("a freed slot serves evil again");
        assert_eq!(ns, "evil");
        assert_eq!(q.len(), 61);
    }

    #[test]
    fn the_whole_queue_is_bounded() {
        let q = FairQueue::new(10, 25);
        let pushed = (0..100).filter(|i| q.push(&format!("ns-{}", i % 5), *i)).count();
        assert_eq!((pushed, q.len()), (25, 25));
    }
}
