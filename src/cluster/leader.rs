//! Work only one replica does at a time (the provisioner, the safety net's controllers) runs
//! while that replica holds a coordination Lease. The webhook and the extender serve on every
//! replica.

use std::future::Future;
use std::time::Duration;

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;

use prometheus_client::metrics::gauge::Gauge;

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("lease {name} in {namespace}: {source}")]
    Lease { name: String, namespace: String, source: kube_lease_manager::LeaseManagerError },
    #[error("the lease manager stopped")]
    Stopped,
    #[error("the work under lease {0} stopped while this replica held it")]
    WorkEnded(String),
}

/// Run `work()` while this replica holds the lease `name` in `namespace`; stop it when the lease
/// is lost and start it afresh when regained. Returns only on error. `candidate` is 1 while this
/// replica campaigns (alerts tell "no leader" from "not running"), `leader_gauge` while it leads.
pub async fn while_leader<F, Fut>(client: Client, namespace: &str, name: &str, duration: Duration, (leader_gauge, candidate): (&Gauge, &Gauge), work: F) -> Result<(), LeaderError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let identity = std::env::var("POD_NAME").unwrap_or_else(|_| format!("archer-{}", std::process::id()));
    let secs = duration.as_secs().max(2);
    let manager = LeaseManagerBuilder::new(client, name)
        .with_namespace(namespace)
        .with_identity(identity.clone())
        .with_duration(secs)
        .with_grace((secs / 3).max(1))
        .build()
        .await
        .map_err(|source| LeaderError::Lease { name: name.into(), namespace: namespace.into(), source })?;
    let (mut is_leader, manager_task) = manager.watch().await;
    candidate.set(1);
    // Both gauges go back to 0 however this ends: an error, or the task aborted at shutdown
    // while /metrics still answers.
    let _campaign = Campaign { leader: leader_gauge, candidate };
    let mut running: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        let leader = *is_leader.borrow_and_update();
        match (leader, running.is_some()) {
            (true, false) => {
                tracing::info!(%identity, lease = name, "became the leader");
                leader_gauge.set(1);
                running = Some(tokio::spawn(work()));
            }
            (false, true) => {
                tracing::warn!(%identity, lease = name, "lost the lease; its work stops here");
                leader_gauge.set(0);
                if let Some(h) = running.take() {
                    h.abort();
                }
            }
            _ => {}
        }
        // Work that ends while the lease is held (a loop panicked) must not leave a leader that
        // does nothing: give up, and let the process restart.
        let ended = match running.as_mut() {
            Some(h) => tokio::select! {
                changed = is_leader.changed() => changed.is_err().then_some(LeaderError::Stopped),
                _ = h => Some(LeaderError::WorkEnded(name.to_string())),
            },
            None => is_leader.changed().await.is_err().then_some(LeaderError::Stopped),
        };
        if let Some(e) = ended {
            if let Some(h) = running.take() {
                h.abort();
            }
            manager_task.abort();
            return Err(e);
        }
    }
}

/// Resets the leader and candidate gauges when the campaign ends, by return or by abort.
struct Campaign<'a> {
    leader: &'a Gauge,
    candidate: &'a Gauge,
}

impl Drop for Campaign<'_> {
    fn drop(&mut self) {
        self.leader.set(0);
        self.candidate.set(0);
    }
}
