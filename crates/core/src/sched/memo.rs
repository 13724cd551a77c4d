//! The spread counts and inter-pod domains a pod's filters need, kept per kind of pod and brought
//! up to date as pods are bound and nodes added, so checking the N-th pod of a plan costs what it
//! adds, not a rescan of every pod placed before it (kube-scheduler rebuilds this state per pod in
//! PreFilter; a plan of 20,000 pods cannot). The state is exactly what [`spread::State::new`] and
//! [`interpod::State::new`] compute from scratch (a test compares them).

use std::collections::HashMap;
use std::fmt::Write;

use super::{interpod, spread, NodeInfo, PodInfo, Snapshot};

/// One kind of pod: the state its filters read, and how many of the snapshot's nodes it has seen.
#[derive(Debug, Clone)]
struct Entry {
    pod: PodInfo,
    spread: spread::State,
    interpod: interpod::State,
    nodes_seen: usize,
}

/// Entries by kind (see [`kind`]).
#[derive(Debug, Clone, Default)]
pub(super) struct Memo {
    entries: HashMap<String, Entry>,
}

/// Everything the two states depend on: pods with the same kind share them.
fn kind(pod: &PodInfo) -> String {
    let mut k = String::with_capacity(256);
    let _ = write!(
        k,
        "{}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
        pod.namespace, pod.labels, pod.spread, pod.affinity, pod.anti_affinity, pod.node_selector, pod.required_terms, pod.tolerations, pod.potential
    );
    k
}

impl Memo {
    /// Run `f` with the pod's state, brought up to date with `s`.
    pub(super) fn with<R>(&mut self, s: &Snapshot, pod: &PodInfo, f: impl FnOnce(&spread::State, &interpod::State) -> R) -> R {
        let entry = self.entries.entry(kind(pod)).or_insert_with(|| Entry { pod: pod.clone(), spread: spread::State::new(s, pod), interpod: interpod::State::new(s, pod), nodes_seen: s.nodes.len() });
        entry.catch_up(s);
        f(&entry.spread, &entry.interpod)
    }

    /// Before `other` is bound to node `i` of `s`: every entry catches up with the nodes added
    /// since it last looked, then counts `other`.
    pub(super) fn bind(&mut self, s: &Snapshot, other: &PodInfo, i: usize) {
        let node: &NodeInfo = &s.nodes[i];
        for e in self.entries.values_mut() {
            e.catch_up(s);
            e.spread.add_pod(&e.pod, node, other);
            e.interpod.add_pod(s, &e.pod, node, other);
        }
    }
}

impl Entry {
    /// Count the nodes added to `s` since this entry last looked, with the pods already on them.
    fn catch_up(&mut self, s: &Snapshot) {
        for node in &s.nodes[self.nodes_seen.min(s.nodes.len())..] {
            self.spread.add_node(s, &self.pod, node);
            for &p in &node.pods {
                self.interpod.add_pod(s, &self.pod, node, &s.pods[p]);
            }
        }
        self.nodes_seen = s.nodes.len();
    }
}
