//! Kubelet's status shapes for a binary of the wrong architecture, and look-alikes that are not.

use serde_json::json;

use super::*;

fn pod(status: serde_json::Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "shop"}, "spec": {"containers": []}, "status": status})).expect("pod")
}

const RUNC: &str = "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: exec: \"/app\": exec format error: unknown";

#[test]
fn a_start_error_under_crash_loop_back_off_is_found_with_its_digest() {
    let p = pod(json!({"phase": "Running", "containerStatuses": [{
        "name": "app", "image": "registry.local/app:1", "imageID": "registry.local/app@sha256:abc", "ready": false, "restartCount": 3,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container=app pod=p_shop(uid)"}},
        "lastState": {"terminated": {"exitCode": 128, "reason": "StartError", "message": RUNC}}
    }]}));
    let found = exec_format_errors(&p);
    assert_eq!(found.len(), 1);
    assert_eq!((found[0].container.as_str(), found[0].reason.as_str(), found[0].digest.as_deref()), ("app", "StartError", Some("sha256:abc")));
}

#[test]
fn a_run_container_error_wait_a_log_tail_and_an_init_container_are_found() {
    let p = pod(json!({"phase": "Pending",
        "initContainerStatuses": [{"name": "init", "image": "i:1", "imageID": "sha256:def", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "RunContainerError", "message": RUNC}}}],
        "containerStatuses": [{"name": "sh", "image": "s:1", "imageID": "", "ready": false, "restartCount": 1,
            "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "exec /docker-entrypoint.sh: exec format error\n"}}}]}));
    let found: Vec<(String, String, Option<String>)> = exec_format_errors(&p).into_iter().map(|e| (e.container, e.reason, e.digest)).collect();
    assert_eq!(found, [("init".into(), "RunContainerError".into(), Some("sha256:def".into())), ("sh".into(), "Error".into(), None)]);
}

#[test]
fn other_failures_and_healthy_pods_are_not_exec_format_errors() {
    let p = pod(json!({"phase": "Running", "containerStatuses": [
        {"name": "oom", "image": "a:1", "imageID": "sha256:1", "ready": false, "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}, "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}},
        {"name": "missing", "image": "b:1", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "RunContainerError", "message": "exec: \"/nope\": stat /nope: no such file or directory"}}},
        {"name": "ok", "image": "c:1", "imageID": "sha256:3", "ready": true, "restartCount": 0, "state": {"running": {}}}
    ]}));
    assert!(exec_format_errors(&p).is_empty());
    assert!(exec_format_errors(&pod(json!(null))).is_empty());
}

#[test]
fn only_the_runtimes_own_report_is_runtime_evidence() {
    // A container that writes the words to its termination log (or logs them under
    // FallbackToLogsOnError) ends with reason Error or Completed: its own words.
    let p = pod(json!({"phase": "Running", "containerStatuses": [
        {"name": "forged", "image": "python:3.12", "imageID": "sha256:1", "ready": false, "restartCount": 1,
            "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "exec format error"}}},
        {"name": "done", "image": "python:3.12", "imageID": "sha256:1", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": "exec format error"}}},
        {"name": "real", "image": "a:1", "imageID": "sha256:2", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}, "lastState": {"terminated": {"exitCode": 128, "reason": "StartError", "message": RUNC}}},
        {"name": "waiting", "image": "a:1", "imageID": "sha256:2", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "RunContainerError", "message": RUNC}}}
    ]}));
    let found: Vec<(String, Evidence)> = exec_format_errors(&p).into_iter().map(|e| (e.container, e.evidence)).collect();
    assert_eq!(found, [("forged".into(), Evidence::Container), ("done".into(), Evidence::Container), ("real".into(), Evidence::Runtime), ("waiting".into(), Evidence::Runtime)]);
}

/// What Debian's runc 1.1 (containerd 1.6) reported on the e2e real node for an amd64 manifest
/// holding an arm64 binary: a termination with no message, the same second it started; the
/// words are in the container's log.
fn runc_1_1_status(state: &str, started: &str, finished: &str, exit: i32, message: Option<&str>) -> Pod {
    let terminated = json!({"containerID": "containerd://ecfa", "exitCode": exit, "reason": "Error", "startedAt": started, "finishedAt": finished, "message": message});
    let (current, last) = if state == "now" { (json!({"terminated": terminated}), json!({})) } else { (json!({"waiting": {"reason": "CrashLoopBackOff"}}), json!({"terminated": terminated})) };
    pod(json!({"containerStatuses": [{"name": "app", "image": "reg/liar:1", "imageID": "reg/liar@sha256:33d4", "ready": false, "restartCount": 0, "state": current, "lastState": last}]}))
}

/// 2026-11-28T18:39:00Z, eleven seconds after the failure.
const NOW: i64 = 1_795_891_140;

#[test]
fn a_container_that_exits_at_once_is_read_for_its_log() {
    let now = runc_1_1_status("now", "2026-11-28T18:38:49Z", "2026-11-28T18:38:49Z", 1, None);
    assert!(exec_format_errors(&now).is_empty(), "nothing in the status says it");
    let exits = quick_exits(&now, NOW);
    assert_eq!(exits.len(), 1);
    assert_eq!((exits[0].previous, exits[0].digest.as_deref(), exits[0].reason.as_str(), exits[0].instance.as_str()), (false, Some("sha256:33d4"), "Error", "containerd://ecfa"));
    let found = in_log(&exits[0], "exec /tiny: exec format error\n").expect("the line");
    assert_eq!((found.message.as_str(), found.evidence), ("exec /tiny: exec format error", Evidence::ExitedAtOnce));
    assert_eq!(in_log(&exits[0], "panic: no config\n"), None, "another crash");
    // After a restart the exit is the last state: the previous container's log is read.
    let restarted = runc_1_1_status("last", "2026-11-28T18:38:49Z", "2026-11-28T18:38:51Z", 1, None);
    assert!(quick_exits(&restarted, NOW)[0].previous);
    // Not read: a container that ran longer, exited 0, was killed by a signal or the OOM killer,
    // failed long ago, or whose status already says it.
    let not = |started: &str, finished: &str, exit: i32, message: Option<&str>| quick_exits(&runc_1_1_status("now", started, finished, exit, message), NOW).is_empty();
    assert!(not("2026-11-28T18:38:49Z", "2026-11-28T18:38:52Z", 1, None), "ran 3 s");
    assert!(not("2026-11-28T18:38:49Z", "2026-11-28T18:38:49Z", 0, None), "succeeded");
    assert!(not("2026-11-28T18:38:49Z", "2026-11-28T18:38:49Z", 137, None), "SIGKILL");
    assert!(not("2026-11-28T18:18:49Z", "2026-11-28T18:18:49Z", 1, None), "twenty minutes ago");
    assert!(not("2026-11-28T18:38:49Z", "2026-11-28T18:38:49Z", 1, Some("exec format error")), "the status says it");
    let mut oom = runc_1_1_status("now", "2026-11-28T18:38:49Z", "2026-11-28T18:38:49Z", 1, None);
    if let Some(t) = oom.status.as_mut().and_then(|s| s.container_statuses.as_mut()).and_then(|c| c[0].state.as_mut()).and_then(|s| s.terminated.as_mut()) {
        t.reason = Some("OOMKilled".into());
    }
    assert!(quick_exits(&oom, NOW).is_empty(), "OOMKilled");
    assert!(quick_exits(&pod(json!({"containerStatuses": [{"name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}}]})), NOW).is_empty());
    // Running again after a quick exit: the entrypoint execs, the old exit is not read.
    let mut back = runc_1_1_status("last", "2026-11-28T18:38:49Z", "2026-11-28T18:38:49Z", 1, None);
    if let Some(c) = back.status.as_mut().and_then(|s| s.container_statuses.as_mut()) {
        c[0].state = Some(k8s_openapi::api::core::v1::ContainerState { running: Some(Default::default()), ..Default::default() });
    }
    assert!(quick_exits(&back, NOW).is_empty(), "running again");
    // A pod's many containers: at most MAX_QUICK_EXITS_PER_POD are read.
    let terminated = json!({"terminated": {"containerID": "containerd://x", "exitCode": 1, "reason": "Error", "startedAt": "2026-11-28T18:38:49Z", "finishedAt": "2026-11-28T18:38:49Z"}});
    let many: Vec<serde_json::Value> = (0..50).map(|i| json!({"name": format!("c{i}"), "image": "i", "imageID": "", "ready": false, "restartCount": 0, "state": terminated})).collect();
    assert_eq!(quick_exits(&pod(json!({"containerStatuses": many})), NOW).len(), MAX_QUICK_EXITS_PER_POD);
}
