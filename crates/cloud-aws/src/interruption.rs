//! EC2 interruption events, as EventBridge delivers them to an SQS queue: spot interruption
//! warnings, rebalance recommendations, AWS Health scheduled changes and instance state changes.
//! Each message is parsed into the instances it concerns and what to do; a message is deleted
//! only after the handler acted on it (or when it is malformed or of no concern, with a log line
//! and a count).
//!
//! Whoever may send to the queue is not trusted for that: a message is acted on only when it is
//! an event of the sources Karpenter's interruption controller parses (`aws.ec2`, `aws.health`)
//! from the account Archer runs in (STS `GetCallerIdentity`: the account whose credentials launch
//! the instances, known before any instance is, and needing no IAM permission). Any other is
//! deleted and counted (`archer_interruption_messages_dropped_total{reason}`), and so is a message
//! whose handling failed on `interruptionMaxReceives` receives (SQS's `ApproximateReceiveCount`),
//! which would otherwise come back forever.

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
    fn disrupts(self) -> bool {
        !matches!(self, Kind::Rebalance)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interruption {
    pub kind: Kind,
    pub instance_ids: Vec<String>,
}

/// The event sources Karpenter's interruption controller parses messages of.
const SOURCES: [&str; 2] = ["aws.ec2", "aws.health"];

/// Why a message was deleted without being acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// Not an event of [`SOURCES`].
    ForeignSource,
    /// An event of another account than Archer's.
    ForeignAccount,
    /// Its handling failed on the last receive allowed (`interruptionMaxReceives`).
    MaxReceives,
}

impl Dropped {
    /// The metric's `reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::ForeignSource => "foreign_source",
            Dropped::ForeignAccount => "foreign_account",
            Dropped::MaxReceives => "max_receives",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ParseError {
    #[error("not an EventBridge event: {0}")]
    Malformed(String),
    /// Not from a source or account Archer trusts.
    #[error("untrusted event: {1}")]
    Untrusted(Dropped, String),
    /// Well formed and trusted, but nothing Archer acts on (another event or state).
    #[error("ignored event: {0}")]
    Ignored(String),
}

#[derive(Deserialize)]
struct Event {
    source: String,
    #[serde(default)]
    account: String,
    #[serde(rename = "detail-type")]
    detail_type: String,
    #[serde(default)]
    detail: serde_json::Value,
}

/// What the queue's messages are checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trust {
    /// The account Archer runs in: events of any other are dropped.
    pub account: String,
    /// A message whose handling failed on this receive is deleted.
    pub max_receives: u32,
}

/// The account the SDK's credentials belong to (STS `GetCallerIdentity`).
async fn own_account(sts: &aws_sdk_sts::Client) -> Result<String, String> {
    let r = sts.get_caller_identity().send().await.map_err(|e| aws_sdk_sts::error::DisplayErrorContext(&e).to_string())?;
    r.account().filter(|a| !a.is_empty()).map(String::from).ok_or_else(|| "STS GetCallerIdentity named no account".to_string())
}

/// Parse one message body: an event of [`SOURCES`] from `account`, or why not.
pub(crate) fn parse(body: &str, account: &str) -> Result<Interruption, ParseError> {
    let e: Event = serde_json::from_str(body).map_err(|e| ParseError::Malformed(e.to_string()))?;
    if !SOURCES.contains(&e.source.as_str()) {
        return Err(ParseError::Untrusted(Dropped::ForeignSource, format!("source {:?} is not one of {}", e.source, SOURCES.join(", "))));
    }
    if e.account != account {
        return Err(ParseError::Untrusted(Dropped::ForeignAccount, format!("{} event of account {:?}, not Archer's {account}", e.source, e.account)));
    }
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

/// Read the queue until dropped, handing each notice to `handler`: once the queue's URL and
/// Archer's own account are known, and only the notices that account's EC2 and Health sent.
pub(crate) async fn run(sqs: aws_sdk_sqs::Client, sts: aws_sdk_sts::Client, queue: String, max_receives: u32, handler: std::sync::Arc<dyn archer_cloud::InterruptionHandler>) {
    let url = loop {
        match queue_url(&sqs, &queue).await {
            Ok(u) => break u,
            Err(e) => {
                tracing::warn!(queue = %queue, error = %e, "interruption queue not found; retrying in 30s");
                tokio::time::sleep(std::time::Duration::from_secs(30)).await;
            }
        }
    };
    let account = loop {
        match own_account(&sts).await {
            Ok(a) => break a,
            Err(e) => {
                tracing::warn!(error = %e, "Archer's AWS account unknown (STS GetCallerIdentity), interruption messages wait; retrying in 30s");
                tokio::time::sleep(std::time::Duration::from_secs(30)).await;
            }
        }
    };
    tracing::info!(queue = %url, account = %account, max_receives, "reading interruption events");
    let trust = Trust { account, max_receives };
    loop {
        let h = handler.clone();
        let result = receive_once(&sqs, &url, WAIT_SECONDS, &trust, |i: Interruption| {
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
                    if let Outcome::Dropped(why) = outcome {
                        handler.dropped(why.as_str());
                    }
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
    /// Deleted without being acted on (or after failing too often), and why.
    Dropped(Dropped),
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Handled => "handled",
            Outcome::Malformed => "malformed",
            Outcome::Ignored => "ignored",
            Outcome::Failed => "failed",
            Outcome::Dropped(_) => "dropped",
        }
    }
}

/// Receive messages once (long poll) and hand each parsed one that `trust` accepts to `handle`;
/// returns each message's kind (`unknown` when it has none) and outcome.
pub async fn receive_once<F, Fut>(sqs: &aws_sdk_sqs::Client, url: &str, wait_seconds: i32, trust: &Trust, handle: F) -> Result<Vec<(&'static str, Outcome)>, String>
where
    F: Fn(Interruption) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    use aws_sdk_sqs::types::MessageSystemAttributeName;
    let r = sqs
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(BATCH)
        .wait_time_seconds(wait_seconds)
        .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
        .send()
        .await
        .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(&e).to_string())?;
    let mut outcomes = Vec::new();
    for m in r.messages() {
        let body = m.body().unwrap_or_default();
        // The first receive is 1; a message SQS gives no count of counts as received once.
        let received: u32 = m.attributes().and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount)).and_then(|n| n.parse().ok()).unwrap_or(1);
        let parsed = parse(body, &trust.account);
        let kind = parsed.as_ref().map(|i| i.kind.as_str()).unwrap_or("unknown");
        let outcome = match parsed {
            Ok(i) => match handle(i.clone()).await {
                Ok(()) => Outcome::Handled,
                Err(e) if received >= trust.max_receives => {
                    tracing::warn!(kind = i.kind.as_str(), instances = ?i.instance_ids, error = %e, received, "interruption not handled on its last receive allowed (interruptionMaxReceives); the message is deleted");
                    Outcome::Dropped(Dropped::MaxReceives)
                }
                Err(e) => {
                    tracing::warn!(kind = i.kind.as_str(), instances = ?i.instance_ids, error = %e, received, "interruption not handled yet; the message comes back");
                    Outcome::Failed
                }
            },
            Err(ParseError::Untrusted(why, said)) => {
                tracing::warn!(reason = why.as_str(), detail = %said, "interruption queue: untrusted message deleted, not acted on");
                Outcome::Dropped(why)
            }
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

    const ACCOUNT: &str = "123456789012";

    #[test]
    fn each_eventbridge_message_kind_parses() {
        let spot = r#"{"version":"0","id":"1","detail-type":"EC2 Spot Instance Interruption Warning","source":"aws.ec2","account":"123456789012","time":"2026-11-25T10:00:00Z","region":"us-east-1","resources":["arn:aws:ec2:us-east-1b:instance/i-0b662ef9931388ba0"],"detail":{"instance-id":"i-0b662ef9931388ba0","instance-action":"terminate"}}"#;
        assert_eq!(parse(spot, ACCOUNT), Ok(Interruption { kind: Kind::SpotInterruption, instance_ids: vec!["i-0b662ef9931388ba0".into()] }));
        let rebalance = r#"{"detail-type":"EC2 Instance Rebalance Recommendation","source":"aws.ec2","account":"123456789012","detail":{"instance-id":"i-1"}}"#;
        assert_eq!(parse(rebalance, ACCOUNT).map(|i| (i.kind, i.kind.disrupts())), Ok((Kind::Rebalance, false)));
        let stopping = r#"{"detail-type":"EC2 Instance State-change Notification","source":"aws.ec2","account":"123456789012","detail":{"instance-id":"i-2","state":"stopping"}}"#;
        assert_eq!(parse(stopping, ACCOUNT).map(|i| i.kind), Ok(Kind::Stopping));
        let running = r#"{"detail-type":"EC2 Instance State-change Notification","source":"aws.ec2","account":"123456789012","detail":{"instance-id":"i-2","state":"running"}}"#;
        assert!(matches!(parse(running, ACCOUNT), Err(ParseError::Ignored(_))));
        let health = r#"{"detail-type":"AWS Health Event","source":"aws.health","account":"123456789012","detail":{"service":"EC2","eventTypeCategory":"scheduledChange","affectedEntities":[{"entityValue":"i-3"},{"entityValue":"i-4"}]}}"#;
        assert_eq!(parse(health, ACCOUNT), Ok(Interruption { kind: Kind::ScheduledChange, instance_ids: vec!["i-3".into(), "i-4".into()] }));
    }

    #[test]
    fn malformed_and_foreign_messages_are_told_apart() {
        assert!(matches!(parse("not json", ACCOUNT), Err(ParseError::Malformed(_))));
        assert!(matches!(parse(r#"{"source":"aws.ec2","account":"123456789012","detail-type":"EC2 Spot Instance Interruption Warning","detail":{}}"#, ACCOUNT), Err(ParseError::Malformed(_))));
        assert!(matches!(parse(r#"{"detail-type":"AWS Health Event","source":"aws.health","account":"123456789012","detail":{"service":"RDS","eventTypeCategory":"scheduledChange"}}"#, ACCOUNT), Err(ParseError::Ignored(_))));
    }

    /// Only EventBridge's EC2 and Health events of Archer's own account are acted on: anyone else
    /// who can send to the queue is dropped, whatever the body says.
    #[test]
    fn events_of_other_sources_or_accounts_are_untrusted() {
        let spot = |source: &str, account: Option<&str>| {
            let mut e = serde_json::json!({"detail-type": "EC2 Spot Instance Interruption Warning", "source": source, "detail": {"instance-id": "i-0123"}});
            if let Some(a) = account {
                e["account"] = a.into();
            }
            parse(&e.to_string(), ACCOUNT)
        };
        assert!(spot("aws.ec2", Some(ACCOUNT)).is_ok());
        for (source, account, why) in [
            ("aws.s3", Some(ACCOUNT), Dropped::ForeignSource),
            ("custom.attacker", Some(ACCOUNT), Dropped::ForeignSource),
            ("aws.ec2 ", Some(ACCOUNT), Dropped::ForeignSource),
            ("aws.ec2", Some("999999999999"), Dropped::ForeignAccount),
            ("aws.ec2", None, Dropped::ForeignAccount),
            ("aws.health", Some(""), Dropped::ForeignAccount),
        ] {
            assert!(matches!(spot(source, account), Err(ParseError::Untrusted(w, _)) if w == why), "{source} {account:?}: {:?}", spot(source, account));
        }
    }
}
