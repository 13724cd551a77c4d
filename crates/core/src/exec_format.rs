//! What kubelet reports when a container's binary is for another architecture
//! ([`exec_format_errors`]). What the safety net does about it is [`super::safety_net`]'s.
//!
//! The runtime fails to start the process (containerd and CRI-O surface runc's `exec format
//! error` as a `StartError` termination or a `RunContainerError` wait), or the container's own
//! shell fails to exec a binary and exits, with the error in its termination message or, under
//! `terminationMessagePolicy: FallbackToLogsOnError`, in the log tail kubelet copies there.
//! Under `CrashLoopBackOff` the evidence is in the last termination.

use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus, Pod};

/// The text every such failure carries (runc's and the kernel's `ENOEXEC`).
const MARK: &str = "exec format error";

/// One container that failed for its binary's architecture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecFormatError {
    pub container: String,
    /// The image as the pod names it.
    pub image: String,
    /// The image's digest as the runtime resolved it (`sha256:...`), when kubelet reported it.
    pub digest: Option<String>,
    /// What showed it: the state's reason (`StartError`, `RunContainerError`, `Error`, ...).
    pub reason: String,
    pub message: String,
    /// Who wrote the text that says it.
    pub evidence: Evidence,
}

/// Who wrote the message that says "exec format error". Only the runtime's own report can be
/// evidence about an image; a container's termination message and log tail are whatever the
/// container (its tenant) chose to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// The runtime could not start the process: kubelet's `StartError` termination or
    /// `RunContainerError` wait, with the runtime's message.
    Runtime,
    /// The container ran and wrote it: its termination message or, under
    /// `FallbackToLogsOnError`, its log tail.
    Container,
}

impl Evidence {
    pub fn as_str(self) -> &'static str {
        match self {
            Evidence::Runtime => "runtime",
            Evidence::Container => "container",
        }
    }
}

/// The reasons under which kubelet writes the runtime's own message (the process never ran).
const RUNTIME_REASONS: [&str; 3] = ["StartError", "RunContainerError", "CreateContainerError"];

fn evidence_of(reason: &str) -> Evidence {
    if RUNTIME_REASONS.contains(&reason) {
        Evidence::Runtime
    } else {
        Evidence::Container
    }
}

/// The digest of a status's `imageID` (`docker.io/library/app@sha256:...` or `sha256:...`).
fn digest_of(image_id: &str) -> Option<String> {
    let d = image_id.rsplit_once('@').map_or(image_id, |(_, d)| d);
    d.starts_with("sha256:").then(|| d.to_string())
}

/// The (reason, message) of a state that says exec format error, if it does.
fn says_it(state: Option<&ContainerState>) -> Option<(String, String)> {
    let s = state?;
    if let Some(w) = &s.waiting {
        let message = w.message.clone().unwrap_or_default();
        if message.contains(MARK) {
            return Some((w.reason.clone().unwrap_or_default(), message));
        }
    }
    let t = s.terminated.as_ref()?;
    let message = t.message.clone().unwrap_or_default();
    message.contains(MARK).then(|| (t.reason.clone().unwrap_or_default(), message))
}

fn of_status(s: &ContainerStatus) -> Option<ExecFormatError> {
    let (reason, message) = says_it(s.state.as_ref()).or_else(|| says_it(s.last_state.as_ref()))?;
    let evidence = evidence_of(&reason);
    Some(ExecFormatError { container: s.name.clone(), image: s.image.clone(), digest: digest_of(&s.image_id), reason, message, evidence })
}

/// The containers (init containers included) of `pod` whose current or last state carries an
/// exec format error.
pub fn exec_format_errors(pod: &Pod) -> Vec<ExecFormatError> {
    let Some(status) = pod.status.as_ref() else { return Vec::new() };
    let all = status.init_container_statuses.iter().flatten().chain(status.container_statuses.iter().flatten());
    all.filter_map(of_status).collect()
}

#[cfg(test)]
mod tests;
