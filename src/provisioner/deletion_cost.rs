//! Writes the deletion costs [`archer_model::deletion_cost::writes`] decides: a few at a time
//! (at most [`PER_PASS`] a second), so a scale-up of thousands of pods never competes
//! with the scheduler's binds for the API server.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch};
use tracing::Instrument;

use archer_metrics::label;
use archer_model::deletion_cost::{self, CostWrite, ARCHER_DELETION_COST, POD_DELETION_COST};
use futures::StreamExt;

use super::context::{Action, Context, ReconcileError};

/// Pods written per pass, and at once.
const PER_PASS: usize = 50;
const IN_FLIGHT: usize = 8;
/// Passes, while there is anything to write; idle, every [`IDLE`].
const EVERY: Duration = Duration::from_secs(1);
const IDLE: Duration = Duration::from_secs(5);

pub struct DeletionCosts {
    ctx: Arc<Context>,
}

impl DeletionCosts {
    pub fn new(ctx: Arc<Context>) -> Self {
        DeletionCosts { ctx }
    }

    /// One pass: the writes the cluster needs now, at most [`PER_PASS`], [`IN_FLIGHT`] at a time.
    pub async fn reconcile(&self) -> Result<Action, ReconcileError> {
        let writes = deletion_cost::writes(&self.ctx.state(), PER_PASS);
        let busy = writes.len() == PER_PASS;
        let outcomes: Vec<&'static str> = futures::stream::iter(writes.into_iter().map(|w| self.write(w))).buffer_unordered(IN_FLIGHT).collect().await;
        for outcome in outcomes {
            self.ctx.metrics.deletion_cost_writes.get_or_create(&label("outcome", outcome)).inc();
        }
        Ok(Action::requeue(if busy { EVERY } else { IDLE }))
    }

    /// Write one pod's cost and its record: `written`, `gone` (the pod was deleted), or `error`.
    async fn write(&self, w: CostWrite) -> &'static str {
        let span = tracing::debug_span!("deletion_cost", pod = %w.name, namespace = %w.namespace, node = %w.node, cost = w.cost);
        let value = w.cost.to_string();
        let patch = Pod { metadata: ObjectMeta { annotations: Some(BTreeMap::from([(POD_DELETION_COST.to_string(), value.clone()), (ARCHER_DELETION_COST.to_string(), value)])), ..Default::default() }, ..Default::default() };
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &w.namespace);
        let params = archer_api::apply::patch_params();
        match api.patch(&w.name, &params, &Patch::Merge(&patch)).instrument(span.clone()).await {
            Ok(_) => "written",
            Err(kube::Error::Api(e)) if e.code == 404 => "gone",
            Err(e) => {
                tracing::warn!(parent: &span, error = %e, "could not write a pod's deletion cost");
                "error"
            }
        }
    }
}
