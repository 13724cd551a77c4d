//! What kubelet reports when a container's binary is for another architecture
//! ([`exec_format_errors`]). What the safety net does about it is [`super::safety_net`]'s.
//!
//! The runtime fails to start the process (containerd and CRI-O surface runc's `exec format
//! error` as a `StartError` termination or a `RunContainerError` wait), or the container's own
//! shell fails to exec a binary and exits, with the error in its termination message or, under
//! `terminationMessagePolicy: FallbackToLogsOnError`, in the log tail kubelet copies there.
//! Under `CrashLoopBackOff` the evidence is in the last termination.
//!
//! runc 1.1 (Debian's, with containerd 1.6) starts the container first and execs its entrypoint
//! afterwards: a binary for another architecture then makes the container exit at once with
//! runc's `exec /app: exec format error` in its log, and nothing in its status
//! ([`quick_exits`], read back with [`in_log`]). A container writes its own log, so that is a
//! container's evidence, as a termination message is.

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
    /// The container exited with an error at once and its log's tail says it: runc 1.1's own
    /// line when the entrypoint fails to exec after the container started ([`quick_exits`]).
    /// The log is the container's, so this is no better evidence than [`Evidence::Container`];
    /// but it is the only report Debian's runtime gives of a real exec format error, so the
    /// image's entrypoint binary is read for it, and only that reading can widen it.
    ExitedAtOnce,
}

impl Evidence {
    pub fn as_str(self) -> &'static str {
        match self {
            Evidence::Runtime => "runtime",
            Evidence::Container => "container",
            Evidence::ExitedAtOnce => "exited_at_once",
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

/// A container that exited with an error this soon after it started may have failed to exec its
/// entrypoint; one that ran longer did not.
pub const QUICK_EXIT_SECONDS: i64 = 2;
/// A quick exit older than this is history (the pod has moved on): not read.
pub const QUICK_EXIT_RECENT_SECONDS: i64 = 600;
/// The log tail read for a quick exit: the runtime's line is the last one or close to it.
pub const LOG_TAIL_LINES: i64 = 5;
pub const LOG_TAIL_BYTES: i64 = 4096;
/// At most this many quick exits of one pod are read: a pod's container count is its own.
pub const MAX_QUICK_EXITS_PER_POD: usize = 4;

/// A container that exited with an error within [`QUICK_EXIT_SECONDS`] of starting, its status
/// saying nothing of an exec format error: its log may (runc 1.1's exec after start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuickExit {
    pub container: String,
    pub image: String,
    pub digest: Option<String>,
    /// The exit is the last termination of a restarted container (read with `previous=true`),
    /// not the current state.
    pub previous: bool,
    pub reason: String,
    /// The runtime's id of the instance that exited: each instance's log is read once.
    pub instance: String,
}

/// An exit that may be a failed exec: an error code (runc 1.1 exits 1; a signal's 128+n and an
/// OOM kill are something else), within [`QUICK_EXIT_SECONDS`] of the start, recent, and with
/// no exec format error already in its message.
fn quick(t: &k8s_openapi::api::core::v1::ContainerStateTerminated, now: i64) -> bool {
    let (Some(started), Some(finished)) = (&t.started_at, &t.finished_at) else { return false };
    let (started, finished) = (started.0.as_second(), finished.0.as_second());
    let lasted = finished - started;
    (1..=128).contains(&t.exit_code)
        && t.reason.as_deref() != Some("OOMKilled")
        && (0..=QUICK_EXIT_SECONDS).contains(&lasted)
        && now - finished <= QUICK_EXIT_RECENT_SECONDS
        && !t.message.as_deref().unwrap_or_default().contains(MARK)
}

/// The containers of `pod` (init containers included) that exited with an error at once, at most
/// [`MAX_QUICK_EXITS_PER_POD`]. A container running again proves its entrypoint execs: its last
/// termination is not one.
pub fn quick_exits(pod: &Pod, now: i64) -> Vec<QuickExit> {
    let Some(status) = pod.status.as_ref() else { return Vec::new() };
    let all = status.init_container_statuses.iter().flatten().chain(status.container_statuses.iter().flatten());
    all.filter_map(|s| {
        let state = s.state.as_ref();
        let current = state.and_then(|st| st.terminated.as_ref()).filter(|t| quick(t, now)).map(|t| (false, t));
        let running = state.is_some_and(|st| st.running.is_some());
        let last = || s.last_state.as_ref().and_then(|st| st.terminated.as_ref()).filter(|t| !running && quick(t, now)).map(|t| (true, t));
        let (previous, t) = current.or_else(last)?;
        Some(QuickExit {
            container: s.name.clone(),
            image: s.image.clone(),
            digest: digest_of(&s.image_id),
            previous,
            reason: t.reason.clone().unwrap_or_default(),
            instance: t.container_id.clone().unwrap_or_default(),
        })
    })
    .take(MAX_QUICK_EXITS_PER_POD)
    .collect()
}

/// The exec format error a quick exit's log tail shows, if it does: the line that says it.
pub fn in_log(exit: &QuickExit, log: &str) -> Option<ExecFormatError> {
    let line = log.lines().rev().find(|l| l.contains(MARK))?;
    let message: String = line.trim().chars().take(512).collect();
    Some(ExecFormatError { container: exit.container.clone(), image: exit.image.clone(), digest: exit.digest.clone(), reason: exit.reason.clone(), message, evidence: Evidence::ExitedAtOnce })
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
