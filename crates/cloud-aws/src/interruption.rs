//! EC2 interruption events, as EventBridge delivers them to an SQS queue: spot interruption
//! warnings, rebalance recommendations, AWS Health scheduled changes and instance state changes.
//! Each message is parsed into the instances it concerns and what to do; a message is deleted
//! only after the handler acted on it (or when it is malformed or of no concern, with a log line
//! and a count).

use std::future::Future;

use serde::Deserialize;

/// What happens to the instances of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Reclaimed in two minutes: replace and drain now.
    SpotInterruption,
    /// Scheduled maintenance (retirement, reboot): replace and drain.
    ScheduledChange,
    /// Stopping, stopped, shutting down or terminated: its node is going or gone.
    Stopping,
    /// Elevated risk of a spot interruption: recorded, no action (as Karpenter does by default).
    Rebalance,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::SpotInterruption => "spot-interruption",
            Kind::ScheduledChange => "scheduled-change",
            Kind::Stopping => "instance-stopping",
            Kind::Rebalance => "rebalance-recommendation",
        }
    }

    /// Whether the instances' nodes are taken out (replaced, drained, deleted).
    pub fn disrupts(self) -> bool {
        !matches!(self, Kind::Rebalance)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interruption {
    pub kind: Kind,
    pub instance_ids: Vec<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("not an EventBridge event: {0}")]
    Malformed(String),
    /// Well formed, but nothing Archer acts on (another source or state).
    #[error("ignored event: {0}")]
    Ignored(String),
}

#[derive(Deserialize)]
struct Event {
    source: String,
    #[serde(rename = "detail-type")]
    detail_type: String,
    #[serde(default)]
    detail: serde_json::Value,
}

/// Parse one message body.
pub fn parse(body: &str) -> Result<Interruption, ParseError> {
    let e: Event = serde_json::from_str(body).map_err(|e| ParseError::Malformed(e.to_string()))?;
    let detail_instance = || e.detail.get("instance-id").and_then(|v| v.as_str()).map(|s| vec![s.to_string()]).ok_or_else(|| ParseError::Malformed(format!("{}: no detail.instance-id", e.detail_type)));
    let kind = match (e.source.as_str(), e.detail_type.as_str()) {
        ("aws.ec2", "EC2 Spot Instance Interruption Warning") => Kind::SpotInterruption,
        ("aws.ec2", "EC2 Instance Rebalance Recommendation") => Kind::Rebalance,
        ("aws.ec2", "EC2 Instance State-change Notification") => {
            let state = e.detail.get("state").and_then(|s| s.as_str()).unwrap_or_default();
            if !["stopping", "stopped", "shutting-down", "terminated"].contains(&state) {
                return Err(ParseError::Ignored(format!("instance state {state:?}")));
            }
            Kind::Stopping
        }
        ("aws.health", "AWS Health Event") => {
            let category = e.detail.get("eventTypeCategory").and_then(|s| s.as_str()).unwrap_or_default();
            let service = e.detail.get("service").and_then(|s| s.as_str()).unwrap_or_default();
            if category != "scheduledChange" || service != "EC2" {
                return Err(ParseError::Ignored(format!("health event {service}/{category}")));
            }
            let ids: Vec<String> = e.detail.get("affectedEntities").and_then(|a| a.as_array()).into_iter().flatten().filter_map(|x| x.get("entityValue").and_then(|v| v.as_str())).filter(|v| v.starts_with("i-")).map(String::from).collect();
            if ids.is_empty() {
                return Err(ParseError::Malformed("scheduled change with no affected instance".into()));
            }
            return Ok(Interruption { kind: Kind::ScheduledChange, instance_ids: ids });
        }
        (s, d) => return Err(ParseError::Ignored(format!("{s}: {d}"))),
    };
    Ok(Interruption { kind, instance_ids: detail_instance()? })
}

/// Read the queue until dropped, handing each notice to `handler`.
pub async fn run(sqs: aws_sdk_sqs::Client, queue: String, handler: std::sync::Arc<dyn archer_cloud::InterruptionHandler>) {
    let url = loop {
        match queue_url(&sqs, &queue).await {
            Ok(u) => break u,
            Err(e) => {
                tracing::warn!(queue = %queue, error = %e, "interruption queue not found; retrying in 30s");
                tokio::time::sleep(std::time::Duration::from_secs(30)).await;
            }
        }
    };
    tracing::info!(queue = %url, "reading interruption events");
    loop {
        let h = handler.clone();
        let result = receive_once(&sqs, &url, WAIT_SECONDS, |i: Interruption| {
            let h = h.clone();
            async move {
                if !i.kind.disrupts() {
                    tracing::info!(kind = i.kind.as_str(), instances = ?i.instance_ids, "interruption notice recorded; no action");
                    return Ok(());
                }
                let notice = archer_cloud::Interruption { kind: i.kind.as_str(), instance_ids: i.instance_ids.clone(), replace_first: i.kind == Kind::ScheduledChange };
                h.interrupted(notice).await
            }
        })
        .await;
        match result {
            Ok(outcomes) => {
                for (kind, outcome) in outcomes {
                    handler.count(kind, outcome.as_str());
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "interruption queue unreadable; retrying in 10s");
                tokio::time::sleep(std::time::Duration::from_secs(10)).await;
            }
        }
    }
}

/// Messages read from the queue at once, and how long a receive waits for one.
const BATCH: i32 = 10;
const WAIT_SECONDS: i32 = 20;

/// The queue's URL from a name or URL.
pub async fn queue_url(sqs: &aws_sdk_sqs::Client, queue: &str) -> Result<String, String> {
    if queue.starts_with("https://") || queue.starts_with("http://") {
        return Ok(queue.to_string());
    }
    let r = sqs.get_queue_url().queue_name(queue).send().await.map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(&e).to_string())?;
    r.queue_url().map(String::from).ok_or_else(|| format!("queue {queue} has no URL"))
}

/// Outcome of one message, for the count and the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Handled,
    Malformed,
    Ignored,
    /// The handler failed: the message stays and comes back after its visibility timeout.
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Handled => "handled",
            Outcome::Malformed => "malformed",
            Outcome::Ignored => "ignored",
            Outcome::Failed => "failed",
        }
    }
}

/// Receive messages once (long poll) and hand each parsed one to `handle`; returns each message's
/// kind (`unknown` when it has none) and outcome.
pub async fn receive_once<F, Fut>(sqs: &aws_sdk_sqs::Client, url: &str, wait_seconds: i32, handle: F) -> Result<Vec<(&'static str, Outcome)>, String>
where
    F: Fn(Interruption) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let r = sqs.receive_message().queue_url(url).max_number_of_messages(BATCH).wait_time_seconds(wait_seconds).send().await.map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(&e).to_string())?;
    let mut outcomes = Vec::new();
    for m in r.messages() {
        let body = m.body().unwrap_or_default();
        let parsed = parse(body);
        let kind = parsed.as_ref().map(|i| i.kind.as_str()).unwrap_or("unknown");
        let outcome = match parsed {
            Ok(i) => match handle(i.clone()).await {
                Ok(()) => Outcome::Handled,
                Err(e) => {
                    tracing::warn!(kind = i.kind.as_str(), instances = ?i.instance_ids, error = %e, "interruption not handled yet; the message comes back");
                    Outcome::Failed
                }
            },
            Err(ParseError::Ignored(why)) => {
                tracing::debug!(reason = %why, "interruption queue: message ignored");
                Outcome::Ignored
            }
            Err(ParseError::Malformed(why)) => {
                tracing::warn!(reason = %why, "interruption queue: malformed message deleted");
                Outcome::Malformed
            }
        };
        if outcome != Outcome::Failed {
            if let Some(h) = m.receipt_handle() {
                if let Err(e) = sqs.delete_message().queue_url(url).receipt_handle(h).send().await {
                    tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "could not delete an interruption message");
                }
            }
        }
        outcomes.push((kind, outcome));
    }
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_eventbridge_message_kind_parses() {
        let spot = r#"{"version":"0","id":"1","detail-type":"EC2 Spot Instance Interruption Warning","source":"aws.ec2","account":"1","time":"2026-11-25T10:00:00Z","region":"us-east-1","resources":["arn:aws:ec2:us-east-1b:instance/i-0b662ef9931388ba0"],"detail":{"instance-id":"i-0b662ef9931388ba0","instance-action":"terminate"}}"#;
        assert_eq!(parse(spot), Ok(Interruption { kind: Kind::SpotInterruption, instance_ids: vec!["i-0b662ef9931388ba0".into()] }));
        let rebalance = r#"{"detail-type":"EC2 Instance Rebalance Recommendation","source":"aws.ec2","detail":{"instance-id":"i-1"}}"#;
        assert_eq!(parse(rebalance).map(|i| (i.kind, i.kind.disrupts())), Ok((Kind::Rebalance, false)));
        let stopping = r#"{"detail-type":"EC2 Instance State-change Notification","source":"aws.ec2","detail":{"instance-id":"i-2","state":"stopping"}}"#;
        assert_eq!(parse(stopping).map(|i| i.kind), Ok(Kind::Stopping));
        let running = r#"{"detail-type":"EC2 Instance State-change Notification","source":"aws.ec2","detail":{"instance-id":"i-2","state":"running"}}"#;
        assert!(matches!(parse(running), Err(ParseError::Ignored(_))));
        let health = r#"{"detail-type":"AWS Health Event","source":"aws.health","detail":{"service":"EC2","eventTypeCategory":"scheduledChange","affectedEntities":[{"entityValue":"i-3"},{"entityValue":"i-4"}]}}"#;
        assert_eq!(parse(health), Ok(Interruption { kind: Kind::ScheduledChange, instance_ids: vec!["i-3".into(), "i-4".into()] }));
    }

    #[test]
    fn malformed_and_foreign_messages_are_told_apart() {
        assert!(matches!(parse("not json"), Err(ParseError::Malformed(_))));
        assert!(matches!(parse(r#"{"source":"aws.ec2","detail-type":"EC2 Spot Instance Interruption Warning","detail":{}}"#), Err(ParseError::Malformed(_))));
        assert!(matches!(parse(r#"{"source":"aws.s3","detail-type":"Object Created","detail":{}}"#), Err(ParseError::Ignored(_))));
        assert!(matches!(parse(r#"{"detail-type":"AWS Health Event","source":"aws.health","detail":{"service":"RDS","eventTypeCategory":"scheduledChange"}}"#), Err(ParseError::Ignored(_))));
    }
}
